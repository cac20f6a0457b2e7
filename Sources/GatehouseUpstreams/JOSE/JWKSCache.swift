public import AsyncHTTPClient
import Crypto
public import Foundation
import GatehouseCore
import JWTKit
import NIOCore
import NIOHTTP1

/// An upstream's JSON Web Key Set (RFC 7517 §5), fetched on first use and cached.
///
/// A JWS naming a `kid` the cached set lacks triggers one refetch (a key rotation upstream), at most
/// once per `refetchInterval`, so a flood of forged kids cannot hammer the upstream. A failed fetch
/// is retried once after a short backoff, then reported as `JOSEError.keySetUnavailable` (503, never
/// a sign-in error). Concurrent fetches are coalesced into one. Keys of types Gatehouse does not
/// verify with (other curves, RSA-PSS, encryption keys, RSA keys under 2048 bits…) are skipped.
public actor JWKSCache {
    /// One key of the set Gatehouse can verify with.
    public final class Key: Sendable {
        /// `kid`, when the set gives one.
        public let id: String?
        /// The one algorithm this key verifies (RSA: RS256, EC P-256: ES256).
        public let algorithm: JWSAlgorithm
        let verifier: Verifier

        init(id: String?, algorithm: JWSAlgorithm, verifier: Verifier) {
            self.id = id
            self.algorithm = algorithm
            self.verifier = verifier
        }

        enum Verifier: Sendable {
            case rsa(any JWTAlgorithm)
            case p256(P256.Signing.PublicKey)
        }

        func verifies(_ signature: Data, of signingInput: Data) -> Bool {
            switch verifier {
            case .rsa(let algorithm):
                return (try? algorithm.verify(signature, signs: signingInput)) ?? false
            case .p256(let publicKey):
                guard let signature = try? P256.Signing.ECDSASignature(rawRepresentation: signature) else { return false }
                return publicKey.isValidSignature(signature, for: signingInput)
            }
        }
    }

    /// What the set holds for a JWS's `kid` and algorithm.
    public enum KeyLookup: Sendable {
        /// The keys to try (usually one).
        case found([Key])
        /// No such key. `refetched`: the set was fetched for this lookup (or joined a fetch under
        /// way), so the kid is unknown to the upstream; otherwise refetching is throttled and the
        /// upstream may have rotated its keys since the last fetch.
        case unknown(refetched: Bool)
        /// The set holds the named key but it cannot verify this algorithm, or the JWS names no key
        /// and the set holds several of the type.
        case unusable(String)
    }

    public typealias Fetch = @Sendable (String) async throws -> (status: Int, body: Data)

    /// Largest key set read.
    public static let maximumKeySetBytes = 256 * 1024

    public let url: String
    let refetchInterval: Duration
    let retryBackoff: Duration
    let fetch: Fetch
    private var keys: [Key]?
    /// Every `kid` of the last set, including keys Gatehouse does not verify with.
    private var knownIDs: Set<String> = []
    private var lastUnknownKeyRefetch: ContinuousClock.Instant?
    private var inFlight: Task<JOSEError?, Never>?
    /// HTTP requests made to the key set endpoint so far (retries included).
    public private(set) var fetches = 0

    public init(url: String, refetchInterval: Duration = .seconds(30), retryBackoff: Duration = .milliseconds(200),
                fetch: @escaping Fetch) {
        self.url = url
        self.refetchInterval = refetchInterval
        self.retryBackoff = retryBackoff
        self.fetch = fetch
    }

    /// The keys for a JWS naming `keyID` (or none) signed with `algorithm` (RS256 or ES256). Throws
    /// only `JOSEError.keySetUnavailable`.
    public func lookup(keyID: String?, algorithm: JWSAlgorithm) async throws(JOSEError) -> KeyLookup {
        var refetched = false
        if keys == nil {
            try await refresh()
            refetched = true
        }
        var result = select(keyID: keyID, algorithm: algorithm)
        if case .unknown = result, !refetched, mayRefetch {
            lastUnknownKeyRefetch = .now
            try await refresh()
            refetched = true
            result = select(keyID: keyID, algorithm: algorithm)
        }
        if case .unknown = result { return .unknown(refetched: refetched) }
        return result
    }

    /// An unknown kid refetches once; another within `refetchInterval` of that refetch does not
    /// (a flood of forged kids cannot hammer the JWKS), whenever the set was last fetched
    /// otherwise, so a key rotated in right after a fetch is still found.
    private var mayRefetch: Bool {
        guard let lastUnknownKeyRefetch else { return true }
        return ContinuousClock.now - lastUnknownKeyRefetch >= refetchInterval
    }

    private func select(keyID: String?, algorithm: JWSAlgorithm) -> KeyLookup {
        let usable = (keys ?? []).filter { $0.algorithm == algorithm }
        if let keyID {
            let named = usable.filter { $0.id == keyID }
            if !named.isEmpty { return .found(named) }
            if knownIDs.contains(keyID) {
                return .unusable("the key the JWS names is not a key Gatehouse verifies \(algorithm.rawValue) with")
            }
            return .unknown(refetched: false)
        }
        switch usable.count {
        case 0: return .unknown(refetched: false)
        case 1: return .found(usable)
        default: return .unusable("the JWS names no key (kid) and the key set holds several \(algorithm.rawValue) keys")
        }
    }

    /// Fetches the set now, or joins the fetch under way.
    private func refresh() async throws(JOSEError) {
        let task: Task<JOSEError?, Never>
        if let inFlight {
            task = inFlight
        } else {
            task = Task { await self.download() }
            inFlight = task
        }
        let failure = await task.value
        if inFlight == task { inFlight = nil }
        if let failure { throw failure }
    }

    /// Two attempts at most, the second only after a quick failure (an attempt that waited out a
    /// timeout is not repeated: whoever waits for the keys would wait as long again); the set is
    /// replaced only by one that parsed.
    private func download() async -> JOSEError? {
        var failure = JOSEError.keySetUnavailable("the key set was not fetched")
        for attempt in 1...2 {
            if attempt > 1 {
                try? await Task.sleep(for: retryBackoff)
            }
            fetches += 1
            let answer: (status: Int, body: Data)
            do {
                answer = try await fetch(url)
            } catch let error as HTTPClientError where [.deadlineExceeded, .readTimeout].contains(error) {
                return .keySetUnavailable("the key set endpoint did not answer in time")
            } catch let error as HTTPClientError where [.connectTimeout, .tlsHandshakeTimeout, .getConnectionFromPoolTimeout].contains(error) {
                return .keySetUnavailable("the key set endpoint cannot be reached")
            } catch is NIOTooManyBytesError {
                failure = .keySetUnavailable("the key set endpoint's answer is too large")
                continue
            } catch {
                failure = .keySetUnavailable("the key set endpoint cannot be reached")
                continue
            }
            guard answer.status == 200 else {
                failure = .keySetUnavailable("the key set endpoint answered HTTP \(answer.status)")
                continue
            }
            guard let parsed = await Self.parseKeySet(answer.body) else {
                failure = .keySetUnavailable("the key set endpoint's answer is not a key set")
                continue
            }
            keys = parsed.keys
            knownIDs = parsed.ids
            return nil
        }
        return failure
    }

    /// The JWK members Gatehouse reads.
    private struct Fields: Sendable {
        var kty: String?
        var kid: String?
        var alg: String?
        var use: String?
        var n: String?
        var e: String?
        var crv: String?
        var x: String?
        var y: String?
    }

    static func parseKeySet(_ body: Data) async -> (keys: [Key], ids: Set<String>)? {
        guard let object = (try? JSONSerialization.jsonObject(with: body)) as? [String: Any],
              let entries = object["keys"] as? [Any]
        else { return nil }
        var all: [Fields] = []
        for case let entry as [String: Any] in entries {
            all.append(Fields(kty: entry["kty"] as? String, kid: entry["kid"] as? String, alg: entry["alg"] as? String,
                              use: entry["use"] as? String, n: entry["n"] as? String, e: entry["e"] as? String,
                              crv: entry["crv"] as? String, x: entry["x"] as? String, y: entry["y"] as? String))
        }
        var keys: [Key] = []
        for fields in all {
            if let key = await makeKey(fields) { keys.append(key) }
        }
        return (keys, Set(all.compactMap(\.kid)))
    }

    private static func makeKey(_ fields: Fields) async -> Key? {
        if let use = fields.use, use != "sig" { return nil }
        switch fields.kty {
        case "RSA":
            guard fields.alg == nil || fields.alg == JWSAlgorithm.rs256.rawValue,
                  let n = fields.n, let e = fields.e,
                  let publicKey = try? JWTKit.Insecure.RSA.PublicKey(modulus: n, exponent: e)
            else { return nil }
            let collection = JWTKeyCollection()
            await collection.add(rsa: publicKey, digestAlgorithm: .sha256)
            guard let algorithm = try? await collection.getKey(), algorithm.name == JWSAlgorithm.rs256.rawValue else { return nil }
            return Key(id: fields.kid, algorithm: .rs256, verifier: .rsa(algorithm))
        case "EC":
            guard fields.alg == nil || fields.alg == JWSAlgorithm.es256.rawValue, fields.crv == "P-256",
                  let x = fields.x.flatMap(Base64URL.decode), let y = fields.y.flatMap(Base64URL.decode),
                  x.count == 32, y.count == 32,
                  let publicKey = try? P256.Signing.PublicKey(rawRepresentation: x + y)
            else { return nil }
            return Key(id: fields.kid, algorithm: .es256, verifier: .p256(publicKey))
        default:
            return nil
        }
    }

    /// A `fetch` for `init` over AsyncHTTPClient: `GET url` accepting JSON, the whole exchange
    /// (body included, at most `maximumKeySetBytes`) bounded by `timeout`, counted and traced as
    /// the upstream's `jwks` endpoint.
    public static func httpFetcher(client: HTTPClient, timeout: Duration, telemetry: UpstreamTelemetry) -> Fetch {
        { url in
            var request = HTTPClientRequest(url: url)
            request.headers.add(name: "Accept", value: "application/json")
            return try await telemetry.call(.jwks, request, classify: { (answer: (status: Int, body: Data)) in
                (GatehouseMetrics.Outcome(status: answer.status), answer.status)
            }, send: { request in
                try await withDeadline(timeout, orThrow: { HTTPClientError.deadlineExceeded }) {
                    let response = try await client.execute(request, timeout: .nanoseconds(timeout.inNanoseconds))
                    let body = try await response.body.collect(upTo: JWKSCache.maximumKeySetBytes)
                    return (status: Int(response.status.code), body: Data(body.readableBytesView))
                }
            })
        }
    }
}
