import Crypto
public import Foundation

/// JSON Web Keys (RFC 7517) as Gatehouse reads and publishes them: public members only.
public enum JSONWebKey {
    /// The RFC 7638 thumbprint of a public JWK: SHA-256 of its required members, in order, as
    /// compact JSON (DPoP `jkt`, and the `kid` of every key Gatehouse publishes); `nil` for a key
    /// type Gatehouse does not take or a member that is not a plain string.
    public static func thumbprint(of jwk: [String: Any]) -> String? {
        func member(_ name: String) -> String? {
            guard let value = jwk[name] as? String, value.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F && $0 != UInt8(ascii: "\"") && $0 != UInt8(ascii: "\\") })
            else { return nil }
            return value
        }
        let canonical: String
        switch jwk["kty"] as? String {
        case "EC":
            guard let crv = member("crv"), let x = member("x"), let y = member("y") else { return nil }
            canonical = #"{"crv":"\#(crv)","kty":"EC","x":"\#(x)","y":"\#(y)"}"#
        case "RSA":
            guard let e = member("e"), let n = member("n") else { return nil }
            canonical = #"{"e":"\#(e)","kty":"RSA","n":"\#(n)"}"#
        case "OKP":
            guard let crv = member("crv"), let x = member("x") else { return nil }
            canonical = #"{"crv":"\#(crv)","kty":"OKP","x":"\#(x)"}"#
        default:
            return nil
        }
        return Base64URL.encode(SHA256.hash(data: Data(canonical.utf8)))
    }

    /// An RSA public key's members from its big-endian modulus and exponent (RFC 7518 §6.3.1).
    public static func rsaParameters(modulus: Data, exponent: Data) -> [String: String] {
        ["kty": "RSA", "n": Base64URL.encode(modulus), "e": Base64URL.encode(exponent)]
    }

    /// An EC public key's members from its uncompressed point (`0x04 || x || y`, RFC 7518 §6.2.1).
    public static func ecParameters(curve: String, point: Data) -> [String: String] {
        let size = (point.count - 1) / 2
        return ["kty": "EC", "crv": curve, "x": Base64URL.encode(point.dropFirst().prefix(size)), "y": Base64URL.encode(point.suffix(size))]
    }
}
