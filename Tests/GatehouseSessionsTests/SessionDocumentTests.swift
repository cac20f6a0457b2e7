import Foundation
@testable import GatehouseSessions
import Testing

/// What a sealed session keeps: the upstream's token response, and the verified userinfo under a
/// member that is Gatehouse's alone.
struct SessionDocumentTests {
    static func object(_ data: Data) throws -> [String: Any] {
        try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
    }

    @Test func theVerifiedUserinfoIsKeptByteForByte() throws {
        let userinfo = Data(#"{"sub":"abc","given_name":"Angela Claire Louise","birthdate":"1962-08-24"}"#.utf8)
        let document = try SessionServices.sessionDocument(tokens: Data(#"{"access_token":"a","token_type":"Bearer"}"#.utf8),
                                                           userinfo: userinfo)
        #expect(try Self.object(document)[SessionServices.userinfoMember] as? String == String(decoding: userinfo, as: UTF8.self))
    }

    @Test func anUpstreamCannotPlantTheUserinfoMember() throws {
        let planted = Data(#"{"access_token":"a","token_type":"Bearer","gatehouse_userinfo":"{\"sub\":\"someone-else\"}"}"#.utf8)
        let document = try SessionServices.sessionDocument(tokens: planted, userinfo: nil)
        #expect(try Self.object(document)[SessionServices.userinfoMember] == nil)
        // Nor through a refresh: the member kept is the one verified at sign-in.
        let old = try SessionServices.sessionDocument(tokens: Data(#"{"access_token":"a","token_type":"Bearer","refresh_token":"r"}"#.utf8),
                                                      userinfo: Data(#"{"sub":"abc"}"#.utf8))
        let merged = try SessionServices.merge(planted, keepingRefreshTokenOf: old)
        let object = try Self.object(merged)
        #expect(object[SessionServices.userinfoMember] as? String == #"{"sub":"abc"}"#)
        #expect(object["refresh_token"] as? String == "r")
    }
}
