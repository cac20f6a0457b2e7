import Foundation
import GatehouseCore
import Logging

/// In-app sign-in at a central sign-in provider: its magic link, sent for the mobile platform
/// (the link opens the app with a code), then the code verified server-to-server as at its
/// callback. The kind's own magic-link limits apply, as on its `/auth/send-magic-link`.
struct CentralEmailLinkSteps: InAppSignInSteps {
    let upstream: CentralUpstream

    var firstStep: InAppFirstStep { .emailLink }

    func sendEmailLink(to email: String, clientAddress: String?) async -> InAppRefusal? {
        if let refusal = upstream.magicLinks.admit(email, clientAddress: clientAddress, now: Date()) {
            upstream.client.http.logger.notice("magic link refused: too many this hour", metadata: [
                "upstream": .string(upstream.settings.name), "limit": .string(refusal.limit.rawValue),
            ])
            return .rateLimited(retryAfter: refusal.retryAfter)
        }
        do throws(CentralFailure) {
            try await upstream.client.sendMagicLink(email: email, platform: "mobile")
            return nil
        } catch {
            return Self.refusal(error)
        }
    }

    func emailCode(_ code: String, for email: String) async -> InAppOutcome {
        do throws(CentralFailure) {
            let user = try await upstream.client.verify(code: code)
            // The link of another address does not finish this dialogue (its code is spent at the provider).
            guard user.email.lowercased() == email.lowercased() else {
                upstream.client.http.logger.warning("security event: an e-mail link's code of another address", metadata: [
                    "upstream": .string(upstream.settings.name),
                ])
                return .refused(.wrongInput)
            }
            return .signedIn(UpstreamGrant(tokens: nil, userinfo: user.json, subject: user.userId))
        } catch {
            return .refused(Self.refusal(error))
        }
    }

    static func refusal(_ failure: CentralFailure) -> InAppRefusal {
        switch failure {
        case .codeNotFound: .wrongInput
        case .rateLimited(let seconds): .rateLimited(retryAfter: seconds)
        case .upstream(let error): InAppRefusal(error)
        }
    }
}
