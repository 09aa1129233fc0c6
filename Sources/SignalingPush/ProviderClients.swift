import FoundationEssentials
import SignalingCrypto
import SignalingSupport

/// How a request to APNs or FCM ended, for the scheduler and the log.
struct ServiceResult {
    var outcome: WakeUpScheduler.Outcome
    /// The HTTP status (0: no answer).
    var status: Int
    /// The service's reason, or the transport error.
    var detail: String
}

extension ServiceResult {
    /// Requests to the service wait out its back-off (`ServiceBackoff`).
    static func backingOff(_ wait: Duration) -> ServiceResult {
        ServiceResult(outcome: .failed(retryAfter: wait), status: 0, detail: "reconnecting after failures")
    }

    /// libcurl would not start the request.
    static let notStarted = ServiceResult(outcome: .failed(retryAfter: nil), status: 0, detail: "libcurl refused the request")
}

/// Reconnecting with back-off: after a request fails without an answer (connection
/// refused, TLS failure, reset, timeout), requests to that service wait 1 s, 2 s, 4 s …
/// up to 60 s (with jitter) before the next connection attempt, instead of every due
/// wake-up reconnecting at once. Any answer resets it.
struct ServiceBackoff {
    private(set) var failures = 0
    private(set) var notBefore: Instant?
    private var random = SystemRandomNumberGenerator()

    /// How long requests must still wait (nil: go).
    func wait(now: Instant) -> Duration? {
        guard let notBefore, notBefore > now else { return nil }
        return notBefore - now
    }

    mutating func answered() {
        failures = 0
        notBefore = nil
    }

    mutating func failed(now: Instant) {
        failures += 1
        let ceiling = min(60.0, pow2(failures - 1))
        let seconds = Double.random(in: (ceiling / 2)...ceiling, using: &random)
        notBefore = now + .nanoseconds(Int64(seconds * 1e9))
    }

    private func pow2(_ exponent: Int) -> Double { Double(1 << min(max(exponent, 0), 20)) }

    /// Notes whether `response` was an answer: a transport failure (no answer) extends the
    /// back-off and is the result; an answer of any status resets it and is for the
    /// service's own classification (nil).
    mutating func transportFailure(of response: HTTP2Client.Response, now: Instant) -> ServiceResult? {
        guard let error = response.transportError else {
            answered()
            return nil
        }
        failed(now: now)
        return ServiceResult(outcome: .failed(retryAfter: nil), status: 0, detail: error)
    }
}

/// Apple's push service: provider-token authentication (an ES256 JWT signed with the
/// team's `.p8` key, reused for `tokenRefreshInterval`, replaced on ExpiredProviderToken
/// but never sooner than 20 minutes after the last one), one HTTP/2 connection per
/// environment. Confined to the push loop's thread.
final class APNsClient {
    private(set) var configuration: APNsConfiguration
    private let http: HTTP2Client
    private let clock: any Clock
    private let timeout: Duration
    private var token: (value: String, issuedAt: Instant)?
    private var backoff = ServiceBackoff()
    /// Provider tokens signed so far (tests and the log).
    private(set) var tokensIssued = 0

    init(configuration: APNsConfiguration, http: HTTP2Client, clock: any Clock, timeout: Duration) {
        self.configuration = configuration
        self.http = http
        self.clock = clock
        self.timeout = timeout
    }

    /// Sends `request`; `completion` runs once, on the loop's thread.
    func send(_ request: APNsRequest, completion: @escaping (ServiceResult) -> Void) {
        send(request, mayRefresh: true, completion: completion)
    }

    private func send(_ request: APNsRequest, mayRefresh: Bool, completion: @escaping (ServiceResult) -> Void) {
        let now = clock.now()
        if let wait = backoff.wait(now: now) {
            completion(.backingOff(wait))
            return
        }
        let bearer: String
        do {
            bearer = try providerToken(now: now)
        } catch {
            completion(ServiceResult(outcome: .rejected(reason: "provider token: \(error)"), status: 0, detail: "\(error)"))
            return
        }
        var headers = [
            "authorization: bearer \(bearer)", "apns-topic: \(request.topic)", "apns-push-type: \(request.pushType)",
            "apns-priority: \(request.priority)", "content-type: application/json",
        ]
        if request.expiration > 0 { headers.append("apns-expiration: \(request.expiration)") }
        if let collapse = request.collapseID { headers.append("apns-collapse-id: \(collapse)") }
        let base = request.sandbox ? configuration.sandboxURL : configuration.productionURL
        let started = http.post(url: base + request.path, headers: headers, body: request.payload, timeout: timeout) { [self] response in
            let result = classify(response)
            if case .failed = result.outcome, result.status == 403, result.detail == "ExpiredProviderToken" {
                if mayRefresh, let token, clock.now() - token.issuedAt >= APNsConfiguration.minimumTokenAge {
                    self.token = nil
                    send(request, mayRefresh: false, completion: completion)
                    return
                }
                // Refreshed too recently (clocks disagree): Apple would answer
                // TooManyProviderTokenUpdates. Retry once the token may be replaced.
                let age = token.map { clock.now() - $0.issuedAt } ?? .zero
                completion(ServiceResult(
                    outcome: .failed(retryAfter: APNsConfiguration.minimumTokenAge - age), status: 403, detail: result.detail))
                return
            }
            completion(result)
        }
        if !started { completion(.notStarted) }
    }

    /// Puts a reloaded key (and key id, team id) in force: the next request signs a new
    /// provider token with it at once. A new key is a new token, not a refresh of the old
    /// one, and a rotation is a rare operator action: it does not wait for the 20 minutes.
    func replaceCredentials(_ new: APNsConfiguration) {
        configuration = configuration.withCredentials(of: new)
        token = nil
    }

    /// The current provider token, signed anew when it is `tokenRefreshInterval` old.
    func providerToken(now: Instant) throws(CryptoError) -> String {
        if let token, now - token.issuedAt < configuration.tokenRefreshInterval { return token.value }
        let issuedAt = clock.wallMilliseconds() / 1000
        var header = #"{"alg":"ES256","kid":"#
        header += TextEscaping.jsonString(configuration.keyID) + "}"
        let claims = #"{"iss":"# + TextEscaping.jsonString(configuration.teamID) + #","iat":\#(issuedAt)}"#
        let value = try configuration.key.token(headerJSON: header, claimsJSON: claims)
        token = (value, now)
        tokensIssued += 1
        return value
    }

    /// APNs' answers (Apple's "Handling notification responses from APNs").
    private func classify(_ response: HTTP2Client.Response) -> ServiceResult {
        if let failure = backoff.transportFailure(of: response, now: clock.now()) { return failure }
        let status = response.status
        struct ErrorBody: Decodable { var reason: String }
        let reason = (try? JSONDecoder().decode(ErrorBody.self, from: Data(response.body)))?.reason ?? "status \(status)"
        switch status {
        case 200..<300:
            return ServiceResult(outcome: .delivered, status: status, detail: "")
        case 410:
            return ServiceResult(outcome: .tokenInvalid(reason: reason), status: status, detail: reason)
        case 400 where reason == "BadDeviceToken", 400 where reason == "Unregistered":
            return ServiceResult(outcome: .tokenInvalid(reason: reason), status: status, detail: reason)
        case 403 where reason == "ExpiredProviderToken":
            return ServiceResult(outcome: .failed(retryAfter: nil), status: status, detail: reason)
        case 429, 500..<600:
            return ServiceResult(outcome: .failed(retryAfter: RetryPolicy.retryAfter(header: response.retryAfter)), status: status, detail: reason)
        default:
            return ServiceResult(outcome: .rejected(reason: reason), status: status, detail: reason)
        }
    }
}

/// Firebase Cloud Messaging, HTTP v1: an OAuth2 access token obtained by exchanging an
/// RS256 JWT assertion signed with the service account's key, cached until
/// `tokenRefreshMargin` before it expires; one HTTP/2 connection to FCM (and one to the
/// token endpoint while a token is fetched). Confined to the push loop's thread.
final class FCMClient {
    private(set) var configuration: FCMConfiguration
    private let http: HTTP2Client
    private let clock: any Clock
    private let timeout: Duration
    private var accessToken: (value: String, refreshAt: Instant)?
    private var fetching = false
    /// Messages waiting for an access token.
    private var waiting: [(request: FCMRequest, completion: (ServiceResult) -> Void)] = []
    private var backoff = ServiceBackoff()
    /// Access tokens obtained so far (tests and the log).
    private(set) var tokensFetched = 0
    /// Counts service-account replacements, so that an exchange started with the old
    /// account is not cached after a reload.
    private var accountGeneration = 0

    static let scope = "https://www.googleapis.com/auth/firebase.messaging"

    init(configuration: FCMConfiguration, http: HTTP2Client, clock: any Clock, timeout: Duration) {
        self.configuration = configuration
        self.http = http
        self.clock = clock
        self.timeout = timeout
    }

    func send(_ request: FCMRequest, completion: @escaping (ServiceResult) -> Void) {
        let now = clock.now()
        if let wait = backoff.wait(now: now) {
            completion(.backingOff(wait))
            return
        }
        if let accessToken, now < accessToken.refreshAt {
            post(request, bearer: accessToken.value, completion: completion)
            return
        }
        waiting.append((request, completion))
        fetchAccessToken()
    }

    private func post(_ request: FCMRequest, bearer: String, completion: @escaping (ServiceResult) -> Void) {
        let url = configuration.messagesURL + "/v1/projects/\(configuration.account.projectID)/messages:send"
        let headers = ["authorization: Bearer \(bearer)", "content-type: application/json; charset=utf-8"]
        let started = http.post(url: url, headers: headers, body: request.body, timeout: timeout) { [self] response in
            completion(classify(response))
        }
        if !started { completion(.notStarted) }
    }

    /// Puts a reloaded service account in force: the cached access token (obtained with
    /// the old account) is dropped, so the next message exchanges a new assertion.
    func replaceCredentials(_ new: FCMConfiguration) {
        configuration = configuration.withCredentials(of: new)
        accessToken = nil
        accountGeneration += 1
    }

    /// The JWT assertion of RFC 7523 that Google's token endpoint exchanges for an access token.
    func assertion() throws(CryptoError) -> String {
        let account = configuration.account
        let issuedAt = clock.wallMilliseconds() / 1000
        var header = #"{"alg":"RS256","typ":"JWT""#
        if !account.privateKeyID.isEmpty { header += #","kid":"# + TextEscaping.jsonString(account.privateKeyID) }
        header += "}"
        let claims = #"{"iss":"# + TextEscaping.jsonString(account.clientEmail) + #","scope":"# + TextEscaping.jsonString(Self.scope)
            + #","aud":"# + TextEscaping.jsonString(configuration.tokenURL) + #","iat":\#(issuedAt),"exp":\#(issuedAt + 3600)}"#
        return try account.key.token(headerJSON: header, claimsJSON: claims)
    }

    private func fetchAccessToken() {
        guard !fetching else { return }
        let signed: String
        do {
            signed = try assertion()
        } catch {
            failWaiting(ServiceResult(outcome: .rejected(reason: "assertion: \(error)"), status: 0, detail: "\(error)"))
            return
        }
        fetching = true
        let generation = accountGeneration
        // The assertion is base64url with dots: nothing to percent-encode.
        let form = "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=" + signed
        let started = http.post(
            url: configuration.tokenURL, headers: ["content-type: application/x-www-form-urlencoded"], body: Array(form.utf8),
            timeout: timeout
        ) { [self] response in
            fetching = false
            guard generation == accountGeneration else {
                // The account was replaced meanwhile: exchange the new one's assertion.
                if !waiting.isEmpty { fetchAccessToken() }
                return
            }
            struct TokenBody: Decodable {
                var access_token: String
                var expires_in: Int?
            }
            guard response.transportError == nil, response.status == 200,
                let body = try? JSONDecoder().decode(TokenBody.self, from: Data(response.body)), !body.access_token.isEmpty
            else {
                if response.transportError != nil { backoff.failed(now: clock.now()) }
                let detail = response.transportError ?? "token endpoint status \(response.status)"
                // Retried with back-off like a failed send: a token endpoint that is down
                // or refuses (a revoked key) must not make the wake-ups spin.
                failWaiting(ServiceResult(outcome: .failed(retryAfter: nil), status: response.status, detail: detail))
                return
            }
            backoff.answered()
            tokensFetched += 1
            let lifetime = Duration.seconds(max(60, body.expires_in ?? 3600))
            let refreshAt = clock.now() + max(lifetime - configuration.tokenRefreshMargin, lifetime / 2)
            accessToken = (body.access_token, refreshAt)
            let ready = waiting
            waiting = []
            for entry in ready { post(entry.request, bearer: body.access_token, completion: entry.completion) }
        }
        if !started {
            fetching = false
            failWaiting(ServiceResult(outcome: .failed(retryAfter: nil), status: 0, detail: "libcurl refused the token request"))
        }
    }

    private func failWaiting(_ result: ServiceResult) {
        let failed = waiting
        waiting = []
        for entry in failed { entry.completion(result) }
    }

    /// Abandons the messages waiting for a token (the loop is stopping); returns them.
    func dropWaiting() -> Int {
        defer { waiting = [] }
        return waiting.count
    }

    /// FCM v1's answers: the `errorCode` of the FcmError detail, else the status.
    private func classify(_ response: HTTP2Client.Response) -> ServiceResult {
        if let failure = backoff.transportFailure(of: response, now: clock.now()) { return failure }
        let status = response.status
        struct ErrorBody: Decodable {
            struct Detail: Decodable { var errorCode: String? }
            struct Inner: Decodable {
                var status: String?
                var details: [Detail]?
            }
            var error: Inner
        }
        let parsed = try? JSONDecoder().decode(ErrorBody.self, from: Data(response.body))
        let reason = parsed?.error.details?.lazy.compactMap(\.errorCode).first ?? parsed?.error.status ?? "status \(status)"
        switch status {
        case 200..<300:
            return ServiceResult(outcome: .delivered, status: status, detail: "")
        case 404:
            return ServiceResult(outcome: .tokenInvalid(reason: reason), status: status, detail: reason)
        case _ where reason == "UNREGISTERED":
            return ServiceResult(outcome: .tokenInvalid(reason: reason), status: status, detail: reason)
        case 401:
            // The access token was revoked or expired early: fetch another one.
            accessToken = nil
            return ServiceResult(outcome: .failed(retryAfter: nil), status: status, detail: reason)
        case 429, 500..<600:
            return ServiceResult(outcome: .failed(retryAfter: RetryPolicy.retryAfter(header: response.retryAfter)), status: status, detail: reason)
        default:
            return ServiceResult(outcome: .rejected(reason: reason), status: status, detail: reason)
        }
    }
}
