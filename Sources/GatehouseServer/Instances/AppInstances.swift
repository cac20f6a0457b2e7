import Crypto
import Foundation
import GatehouseAttestation
import GatehouseCore
import Hummingbird
import Logging
import NIOCore

/// App instances (seed 000): each installation of an app registers (RFC 7591), attests with its
/// platform (App Attest, Play Integrity) or certifies by an e-mailed code, and signs in as its
/// own client; `attestation: required` gives tokens to certified instances only.
struct AppInstances: RecordingFeature {
    let configuration: GatehouseConfiguration
    let store: any GatehouseStore
    let now: @Sendable () -> Date
    let logger: Logger
    let audit: AuditLog
    let limits: RateLimiters
    let dpop: DPoPEnforcement
    /// The SMTP relay of manual certification codes (`mail:`).
    let mailer: (any Mailer)?
}

extension AppInstances {
    /// `POST /oauth/register` (RFC 7591 §3): one install of an app registers itself and gets its own
    /// `client_id`, bound to the app's redirect URIs and scopes. `software_id` names the app. A DPoP
    /// proof binds the instance to the proof's key: every later request of the instance must prove
    /// it holds that key, so the client id alone is worth nothing to someone else.
    ///
    /// Registration cannot fill the store: it is limited per client address (before the body is
    /// read) and per app (`rate_limits.registration_per_*`, on by default); an instance that
    /// never signs in lives `pending_lifetime` (minutes), and an app holds at most `max_pending`
    /// such instances, counted and inserted in one statement.
    func register(_ request: Request, peer: String?) async -> Response {
        guard MediaType.matches(request.headers[.contentType], "application/json") else {
            var response = Response.oauthError(.invalidClientMetadata("the body must be application/json (RFC 7591 §3.1)"))
            response.status = .unsupportedMediaType
            return response
        }
        if limits.registrationPerAddress != nil, let address = limits.clientAddress(peer: peer, headers: request.headers),
           let wait = limits.take(.registration_address, key: address) {
            return .oauthError(.rateLimited(retryAfter: wait.retryAfterSeconds))
        }
        guard let body = await boundedBody(request) else {
            return .problem(.payloadTooLarge(limit: configuration.server.maximumBodyBytes), for: request)
        }
        do throws(OAuthError) {
            let metadata = try RegistrationRequest(json: Data(body.readableBytesView))
            guard let app = configuration.clients[metadata.softwareID], let settings = app.instances else {
                throw .invalidClientMetadata("software_id names no app whose instances register here")
            }
            if let wait = limits.take(.registration_app, key: app.clientID, clientID: app.clientID) {
                throw .rateLimited(retryAfter: wait.retryAfterSeconds)
            }
            var narrowed: [String]?
            if let uris = metadata.redirectURIs {
                for uri in uris where !app.redirectURIs.contains(where: { $0.registered == uri }) {
                    throw .invalidRedirectURI("every redirect URI must be one of the app's (\(uri.prefix(100)) is not)")
                }
                // Honoured: the instance's sign-ins may use these only.
                let all = Set(app.redirectURIs.map(\.registered))
                narrowed = Set(uris) == all ? nil : Array(Set(uris)).sorted()
            }
            let proof = app.dpop == .off ? nil : try await dpop.endpointProof(request, endpoint: "/oauth/register")
            if app.dpop == .required, proof == nil {
                throw .invalidDPoPProof("this app's instances register with a DPoP proof of their key")
            }
            let now = self.now()
            let instance = InstanceRecord(id: InstanceID.make(app: app.clientID), softwareID: app.clientID, dpopJKT: proof?.thumbprint,
                                          createdAt: now, expiresAt: now.addingTimeInterval(settings.pendingLifetime.inSeconds),
                                          redirectURIs: narrowed)
            let inserted: Bool
            do {
                inserted = try await store.insertInstance(instance, maximumPending: settings.maximumPending, now: now)
            } catch {
                throw .serverError("Gatehouse could not record the instance")
            }
            guard inserted else {
                limits.refused(.registration_pending, clientID: app.clientID, subject: nil)
                logger.warning("registration refused: the app has its maximum of instances that never signed in",
                               metadata: ["client_id": .string(app.clientID), "max_pending": .stringConvertible(settings.maximumPending)])
                throw .rateLimited(retryAfter: Int(min(settings.pendingLifetime.inSeconds, 300)))
            }
            audit.record(.instance_registered, clientID: instance.id, subject: nil, metadata: [
                "dpop_bound": .stringConvertible(proof != nil),
            ])
            let answer = RegistrationResponse(
                client_id: instance.id, client_id_issued_at: Int(now.timeIntervalSince1970), software_id: app.clientID,
                redirect_uris: narrowed ?? app.redirectURIs.map(\.registered),
                grant_types: ["authorization_code", "refresh_token"], response_types: ["code"], token_endpoint_auth_method: "none",
                scope: app.scopes.joined(separator: " "), attestation: settings.attestation.rawValue,
                dpop_bound_access_tokens: proof != nil)
            return .oauthJSON(JSONCoding.encode(answer), status: .created)
        } catch {
            logger.info("registration refused", metadata: ["error": .string(error.code)])
            return .oauthError(error)
        }
    }

    /// An instance id as logs show it: its app and the first characters of the hash of its random part.
    static func instanceLabel(_ id: String) -> String { InstanceID.label(id) }

    /// The live instance a request names (`client_id`) and its app. When the instance registered
    /// with a DPoP key, `proof` (the request's verified DPoP proof) must be by that key.
    /// `checkingKey: false` where the caller proved its key another way (a bound session's token).
    func liveInstance(_ clientID: String?, proof: VerifiedDPoPProof?, checkingKey: Bool = true) async throws(OAuthError)
        -> (InstanceRecord, AppClient)
    {
        guard let clientID, let client = configuration.appClient(for: clientID), client.isInstance else {
            throw .invalidClient("client_id names no registered app instance")
        }
        let instance: InstanceRecord?
        do {
            instance = try await store.instance(id: clientID)
        } catch {
            throw .serverError("Gatehouse cannot reach its store right now")
        }
        guard let instance, instance.isLive(at: now()) else {
            throw .invalidClient("this app instance is unknown, expired or revoked: register it again")
        }
        if checkingKey, let bound = instance.dpopJKT {
            guard let proof else {
                throw .invalidDPoPProof("this instance registered with a DPoP key: every request carries a proof by it")
            }
            guard proof.thumbprint == bound else { throw .invalidDPoPProof("the DPoP proof is not by the key this instance registered with") }
        }
        return (instance, client)
    }

    /// `attestation: required`: tokens go to certified instances only, by every grant and under the
    /// policy in force at the time of the grant (a reload that turns it on stops the refreshes of
    /// instances that signed in without). The app's own client id is no way around it: its
    /// instances register and certify, the app itself gets nothing.
    static func requireCertification(of client: AppClient, instance: InstanceRecord?) throws(OAuthError) {
        guard let settings = client.instances, settings.attestation == .required else { return }
        guard client.isInstance else {
            throw .unauthorizedClient("this app gives tokens only to certified app instances: register one at /oauth/register and attest it")
        }
        guard let instance, instance.certification != nil else {
            throw .unauthorizedClient(settings.manualCertification
                ? "this app instance is not certified: attest it at /oauth/attestation, or sign in again to certify it by e-mailed code"
                : "this app instance is not certified: attest it at /oauth/attestation first")
        }
    }

    /// Marks an instance used (it expires `unused_lifetime` after its last sign-in or refresh); best effort.
    func touch(_ instance: InstanceRecord, settings: InstanceSettings) async {
        let now = self.now()
        try? await store.touchInstance(id: instance.id, now: now, expiresAt: now.addingTimeInterval(settings.unusedLifetime.inSeconds))
    }

    /// `POST /oauth/attestation/challenge`: a single-use challenge (5 minutes) for the instance's
    /// next App Attest attestation or assertion, or Play Integrity request (its nonce).
    func attestationChallenge(_ request: Request) async -> Response {
        if let refusal = Self.refusingNonFormBody(request) { return refusal }
        do throws(OAuthError) {
            let form = try await oauthForm(request, recognizing: ["client_id"])
            let proof = try await dpop.endpointProof(request, endpoint: "/oauth/attestation/challenge")
            let (instance, client) = try await liveInstance(form["client_id"], proof: proof)
            guard let settings = client.instances, settings.attestation != .off, settings.apple != nil || settings.play != nil else {
                throw .unauthorizedClient("this app's instances do not attest themselves")
            }
            let challenge = SecureToken.generate()
            let lifetime = 300
            do {
                let stored = try await store.insertOnce(kind: Self.attestationChallengeKind, keyHash: SecureToken.hash(challenge),
                                                        value: Data(instance.id.utf8), expiresAt: now().addingTimeInterval(Double(lifetime)),
                                                        now: now())
                guard stored else { throw OAuthError.serverError("Gatehouse could not record the challenge") }
            } catch {
                throw .serverError("Gatehouse could not record the challenge")
            }
            return .oauthJSON(JSONCoding.encode(ChallengeResponse(challenge: challenge, expires_in: lifetime)))
        } catch {
            logger.info("attestation challenge refused", metadata: ["error": .string(error.code)])
            return .oauthError(error)
        }
    }

    static let attestationChallengeKind = "attestation"

    /// A genuine App Attest attestation object carries Apple's receipt (about 3.7 KB) beside its two
    /// certificates: some 5.5 KB, 7.5 KB in base64. Artifacts get room for twice the largest seen
    /// (the body as a whole stays under `server.max_body_bytes`, 16 KiB by default); every other
    /// field keeps the 4 KiB of every form.
    static let attestationFormLimits = FormParameters.Limits(fieldLimits: [
        "attestation_object": 16 * 1024, "integrity_token": 16 * 1024, "assertion": 4 * 1024,
    ])

    /// `POST /oauth/attestation`: the instance proves it is the genuine app, by an App Attest
    /// attestation (`type=apple`: `key_id`, `attestation_object`), an App Attest assertion by the
    /// key attested before (`type=apple_assertion`: `assertion`; its counter must grow), or a Play
    /// Integrity verdict (`type=play`: `integrity_token`, whose nonce is the challenge). The
    /// challenge is spent first, whatever the outcome.
    func attestation(_ request: Request) async -> Response {
        if let refusal = Self.refusingNonFormBody(request) { return refusal }
        do throws(OAuthError) {
            let form = try await oauthForm(request, recognizing: ["client_id", "challenge", "type", "key_id", "attestation_object",
                                                                  "assertion", "integrity_token"], limits: Self.attestationFormLimits)
            let proof = try await dpop.endpointProof(request, endpoint: "/oauth/attestation")
            let (instance, client) = try await liveInstance(form["client_id"], proof: proof)
            guard let settings = client.instances, settings.attestation != .off else {
                throw .unauthorizedClient("this app's instances do not attest themselves")
            }
            guard let challenge = form["challenge"] else { throw .invalidRequest("challenge is required") }
            let owner: Data?
            do {
                owner = try await store.consumeOnce(kind: Self.attestationChallengeKind, keyHash: SecureToken.hash(challenge), now: now())
            } catch {
                throw .serverError("Gatehouse cannot reach its store right now")
            }
            guard let owner, String(decoding: owner, as: UTF8.self) == instance.id else {
                throw .invalidAttestation("the challenge is unknown, expired, already used or another instance's")
            }
            let clientDataHash = Data(SHA256.hash(data: Data(challenge.utf8)))
            let method = try await certify(instance, form: form, settings: settings, challenge: challenge, clientDataHash: clientDataHash)
            audit.record(.instance_certified, clientID: instance.id, subject: nil, metadata: [
                "method": .string(method.rawValue),
            ])
            return .oauthJSON(JSONCoding.encode(AttestationResponse(client_id: instance.id, certified: true, method: method.rawValue)))
        } catch {
            logger.info("attestation refused", metadata: ["error": .string(error.code)])
            return .oauthError(error)
        }
    }

    private func certify(_ instance: InstanceRecord, form: FormParameters, settings: InstanceSettings, challenge: String,
                         clientDataHash: Data) async throws(OAuthError) -> InstanceCertification {
        let now = self.now()
        switch form["type"] {
        case "apple":
            guard let apple = settings.apple else { throw .invalidAttestation("this app does not attest with App Attest") }
            guard let keyIDText = form["key_id"], let keyID = Self.decodeBase64(keyIDText), keyID.count == 32 else {
                throw .invalidRequest("key_id must be the base64 of the 32-byte App Attest key identifier")
            }
            guard let object = form["attestation_object"].flatMap(Self.decodeBase64) else {
                throw .invalidRequest("attestation_object must be the base64 of the attestation object")
            }
            let key: AppAttestKey
            do {
                let policy = try AppAttestPolicy(appID: apple.appID, development: apple.development,
                                                 rootCertificatesPEM: apple.rootCertificatesPEM ?? AppAttest.appleRootPEM)
                key = try await AppAttest.verifyAttestation(object, keyID: keyID, clientDataHash: clientDataHash, policy: policy, now: now)
            } catch {
                throw .invalidAttestation("the App Attest attestation is not valid: \(error.description)")
            }
            try await stored {
                try await store.certifyInstance(id: instance.id, appleKeyID: Base64URL.encode(keyID), publicKey: key.publicKey,
                                                counter: Int(key.counter), now: now)
            }
            return .apple
        case "apple_assertion":
            guard let apple = settings.apple else { throw .invalidAttestation("this app does not attest with App Attest") }
            guard let publicKey = instance.applePublicKey else {
                throw .invalidAttestation("this instance has no attested App Attest key: send an attestation first")
            }
            guard let assertion = form["assertion"].flatMap(Self.decodeBase64) else {
                throw .invalidRequest("assertion must be the base64 of the App Attest assertion")
            }
            let counter: UInt32
            do {
                counter = try AppAttest.verifyAssertion(assertion, clientDataHash: clientDataHash, publicKey: publicKey,
                                                        previousCounter: UInt32(clamping: instance.appleCounter), appID: apple.appID)
            } catch {
                throw .invalidAttestation("the App Attest assertion is not valid: \(error.description)")
            }
            let advanced: Bool
            do {
                advanced = try await store.advanceAppleCounter(id: instance.id, to: Int(counter), now: now)
            } catch {
                throw .serverError("Gatehouse cannot reach its store right now")
            }
            guard advanced else { throw .invalidAttestation("the App Attest assertion's counter did not increase (a replay)") }
            try await stored { try await store.certifyInstance(id: instance.id, as: .apple, now: now) }
            return .apple
        case "play":
            guard let play = settings.play else { throw .invalidAttestation("this app does not attest with Play Integrity") }
            guard let token = form["integrity_token"] else { throw .invalidRequest("integrity_token is required") }
            do {
                let policy = try PlayIntegrityPolicy(packageName: play.packageName, decryptionKeyBase64: play.decryptionKey.reveal(),
                                                     verificationKeyBase64: play.verificationKey.reveal(),
                                                     requiredDeviceVerdict: play.requiredDeviceVerdict, maximumAge: play.maximumAge.inSeconds)
                _ = try PlayIntegrity.verify(token, nonce: challenge, policy: policy, now: now)
            } catch {
                throw .invalidAttestation("the Play Integrity verdict is not valid: \(error.description)")
            }
            try await stored { try await store.certifyInstance(id: instance.id, as: .play, now: now) }
            return .play
        case nil:
            throw .invalidRequest("type is required: apple, apple_assertion or play")
        case let other?:
            throw .invalidRequest("type \(other.prefix(40)) is not one of apple, apple_assertion, play")
        }
    }

    /// Runs a store write that must succeed on a live instance.
    private func stored(_ write: () async throws -> Bool) async throws(OAuthError) {
        let done: Bool
        do {
            done = try await write()
        } catch {
            throw .serverError("Gatehouse cannot reach its store right now")
        }
        guard done else { throw .invalidClient("this app instance is unknown, expired or revoked: register it again") }
    }

    /// Base64 or base64url, padded or not.
    static func decodeBase64(_ text: String) -> Data? {
        Data(base64Encoded: text) ?? Base64URL.decode(text.replacingOccurrences(of: "=", with: ""))
    }
}

/// The metadata an instance registers with (RFC 7591 §2): only what Gatehouse acts on; other
/// members are ignored, as §3.1 allows.
struct RegistrationRequest {
    let softwareID: String
    let redirectURIs: [String]?

    init(json: Data) throws(OAuthError) {
        guard let object = (try? JSONSerialization.jsonObject(with: json)) as? [String: Any] else {
            throw .invalidClientMetadata("the body must be a JSON object")
        }
        guard let softwareID = object["software_id"] as? String, !softwareID.isEmpty else {
            throw .invalidClientMetadata("software_id (the app's client_id) is required")
        }
        self.softwareID = softwareID
        if let uris = object["redirect_uris"] {
            guard let list = uris as? [String], !list.isEmpty else {
                throw .invalidRedirectURI("redirect_uris must be a non-empty array of strings")
            }
            redirectURIs = list
        } else {
            redirectURIs = nil
        }
        if let method = object["token_endpoint_auth_method"] {
            guard method as? String == "none" else {
                throw .invalidClientMetadata("token_endpoint_auth_method must be none: an app instance is a public client")
            }
        }
        if let grants = object["grant_types"] {
            guard let list = grants as? [String], list.allSatisfy(["authorization_code", "refresh_token"].contains) else {
                throw .invalidClientMetadata("grant_types may hold only authorization_code and refresh_token")
            }
        }
        if let types = object["response_types"] {
            guard let list = types as? [String], list.allSatisfy({ $0 == "code" }) else {
                throw .invalidClientMetadata("response_types may hold only code")
            }
        }
    }
}

struct RegistrationResponse: Encodable {
    let client_id: String
    let client_id_issued_at: Int
    let software_id: String
    let redirect_uris: [String]
    let grant_types: [String]
    let response_types: [String]
    let token_endpoint_auth_method: String
    let scope: String
    /// The app's attestation policy: `required` means tokens only once certified.
    let attestation: String
    /// Whether the instance is bound to the DPoP key of its registration (RFC 9449 §5.2's metadata name).
    let dpop_bound_access_tokens: Bool
}

struct AttestationResponse: Encodable {
    let client_id: String
    let certified: Bool
    let method: String
}

struct ChallengeResponse: Encodable {
    let challenge: String
    let expires_in: Int
}
