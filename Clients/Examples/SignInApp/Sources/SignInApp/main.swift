// The smallest app that uses GatehouseSignIn: it makes the client for an issuer and a DPoP key,
// without a request (the dialogue itself is tested end to end, Tests/EndToEnd/test_in_app_sign_in.py),
// and uses its own swift-crypto next to it. It prints one line that scripts/test checks.

import Crypto
import Foundation
import GatehouseSignIn

let key = DPoPKey()
let signIn = try InAppSignIn(issuer: URL(string: "https://gatehouse.example.com")!,
                             clientID: "com.example.app", scope: "openid", dpopKey: key)
let state = await signIn.state
// The app's own use of swift-crypto: the same thumbprint, computed here from the public JWK.
let jwk = key.publicJWK
let canonical = #"{"crv":"P-256","kty":"EC","x":"\#(jwk["x"]!)","y":"\#(jwk["y"]!)"}"#
let digest = Data(SHA256.hash(data: Data(canonical.utf8))).base64EncodedString()
    .replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
    .replacingOccurrences(of: "=", with: "")
guard digest == key.thumbprint else {
    print("SignInApp: the app's thumbprint \(digest) differs from the client's \(key.thumbprint)")
    exit(1)
}
print("SignInApp: client state \(state.name), DPoP thumbprint agrees with the app's swift-crypto")
