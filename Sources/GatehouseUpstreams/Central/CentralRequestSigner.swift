import _CryptoExtras
import Crypto
public import Foundation
import GatehouseCore

/// The S2S signature of the broccoliapps contract, byte for byte as its Node client makes it
/// (`framework/shared/src/contract.ts`) and its verifier checks it (`framework/backend/src/http/s2s.ts`):
///
/// 1. `{appId, body, path, timestamp}`: the raw JSON body text and the contract path, all strings,
///    serialised as `JSON.stringify(payload, Object.keys(payload).sort())` does;
/// 2. the lowercase hex SHA-256 of that text;
/// 3. RSA PKCS#1 v1.5 type-1 "private encryption" of those 64 ASCII characters, without
///    DigestInfo (Node's `crypto.privateEncrypt`), as unpadded base64url.
///
/// The raw RSA operation is BoringSSL's (`RSA_sign_raw`, through swift-crypto's
/// `_RSA.BlindSigning.PrivateKey.blindSignature`, which applies the private exponent to a
/// message of the modulus's size); this type only writes the type-1 padding around the hash.
/// Type-1 padding is deterministic, so the result equals Node's for the same key and input.
public struct CentralRequestSigner: Sendable {
    /// The blind-signing parameters play no part: `blindSignature` is the bare private-key operation.
    private let key: _RSA.BlindSigning.PrivateKey<SHA384>

    /// `privateKeyPEM` is the app's RSA private key (PKCS#8 or PKCS#1), at least 2048 bits. Secret.
    public init(privateKeyPEM: String) throws {
        key = try _RSA.BlindSigning.PrivateKey<SHA384>(pemRepresentation: privateKeyPEM)
    }

    /// The headers that authenticate one request: `x-amz-content-sha256`, `x-ba-request-timestamp`,
    /// `x-ba-app` and `x-ba-signature`.
    public func headers(appID: String, path: String, body: String, timestamp: Date) throws -> [(String, String)] {
        let milliseconds = String(Int64((timestamp.timeIntervalSince1970 * 1000).rounded(.down)))
        return [
            ("x-amz-content-sha256", Self.hexSHA256(Data(body.utf8))),
            ("x-ba-request-timestamp", milliseconds),
            ("x-ba-app", appID),
            ("x-ba-signature", try signature(appID: appID, path: path, body: body, timestamp: milliseconds)),
        ]
    }

    /// `x-ba-signature` for one request (`timestamp` in milliseconds, as sent).
    public func signature(appID: String, path: String, body: String, timestamp: String) throws -> String {
        let hash = Self.hexSHA256(Data(Self.canonicalPayload(appID: appID, path: path, body: body, timestamp: timestamp).utf8))
        return Base64URL.encode(try privateEncrypt(Array(hash.utf8)))
    }

    /// The payload the signature covers, keys sorted as the verifier rebuilds it.
    public static func canonicalPayload(appID: String, path: String, body: String?, timestamp: String) -> String {
        var members = [("appId", appID)]
        if let body { members.append(("body", body)) }
        members += [("path", path), ("timestamp", timestamp)]
        return "{" + members.map { javaScriptString($0.0) + ":" + javaScriptString($0.1) }.joined(separator: ",") + "}"
    }

    /// A string as ECMAScript's `JSON.stringify` writes it (ECMA-262 QuoteJSONString): `"` and
    /// `\` escaped, the short escapes for BS, FF, LF, CR and TAB, other controls and lone
    /// surrogates as lowercase `\uXXXX`, everything else (non-ASCII, U+2028, `/`) as it is.
    public static func javaScriptString(_ text: String) -> String {
        var out = "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\u{08}": out += "\\b"
            case "\u{0C}": out += "\\f"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where scalar.value < 0x20:
                out += "\\u00" + (scalar.value < 0x10 ? "0" : "") + String(scalar.value, radix: 16)
            default: out.unicodeScalars.append(scalar)
            }
        }
        // A Swift String holds no lone surrogates, so that case of QuoteJSONString cannot arise.
        return out + "\""
    }

    public static func hexSHA256(_ data: Data) -> String {
        SHA256.hash(data: data).map { String(format: "%02x", $0) }.joined()
    }

    /// EMSA-PKCS1-v1_5 type 1 around `message` (RFC 8017 §9.2 step 5 without the DigestInfo),
    /// then the RSA private-key operation.
    private func privateEncrypt(_ message: [UInt8]) throws -> Data {
        let size = (key.keySizeInBits + 7) / 8  // RSA_size: a 3073-bit modulus takes 385 bytes
        guard message.count <= size - 11 else { throw CentralSigningError() }
        var block = [UInt8](repeating: 0xFF, count: size)
        block[0] = 0x00
        block[1] = 0x01
        block[size - message.count - 1] = 0x00
        block.replaceSubrange((size - message.count)..<size, with: message)
        return try key.blindSignature(for: block).rawRepresentation
    }
}

struct CentralSigningError: Error {}
