import FoundationEssentials
import SignalingCrypto
import SignalingSupport

/// How the server reaches Apple's push service itself (HTTP/2, token-based provider
/// authentication). docs/PUSH.md, "APNs".
public struct APNsConfiguration: Sendable {
    /// The `.p8` signing key Apple issued (an EC P-256 key in PEM).
    public var key: JWTSigningKey
    /// The key's id (the JWT's `kid`), ten characters in Apple's console.
    public var keyID: String
    /// The developer team id (the JWT's `iss`).
    public var teamID: String
    /// The app's bundle id, for registrations that name no topic. A VoIP push goes to
    /// `<topic>.voip`.
    public var defaultTopic: String
    /// Where production and sandbox tokens go (scheme, host and port; `/3/device/<token>`
    /// is appended). Tests point both at a local server.
    public var productionURL = "https://api.push.apple.com"
    public var sandboxURL = "https://api.sandbox.push.apple.com"
    /// How long a provider token is used before a new one is signed. Apple refuses tokens
    /// older than an hour and answers TooManyProviderTokenUpdates to a provider that
    /// changes its token more often than every 20 minutes: 20-50 minutes.
    public var tokenRefreshInterval: Duration = .seconds(40 * 60)
    /// An HMAC of the key file's text (empty when the key was not read from a file), to
    /// tell a rotated key from the same one read again.
    public private(set) var keyDigest: [UInt8] = []

    public init(key: JWTSigningKey, keyID: String, teamID: String, defaultTopic: String) {
        self.key = key
        self.keyID = keyID
        self.teamID = teamID
        self.defaultTopic = defaultTopic
    }

    /// Reads the `.p8` key (PEM) from `keyFile`: the one place the server reads it, at
    /// start and on each reload (docs/PUSH.md, "Rotating the keys").
    public init(keyFile path: String, keyID: String, teamID: String, defaultTopic: String) throws(UsageError) {
        guard let pem = readTextFile(path) else { throw UsageError("cannot read \(path)") }
        let key: JWTSigningKey
        let digest: [UInt8]
        do {
            key = try JWTSigningKey(pem: pem)
            // Tells a rewritten file from an unchanged one without keeping the secret.
            digest = try HMACSHA256.authenticate(Array(pem.utf8), key: Array("apns-key-file".utf8))
        } catch {
            throw UsageError("\(path): \(error)")
        }
        guard key.algorithm == .es256 else { throw UsageError("\(path): the APNs key must be an EC P-256 (.p8) key") }
        self.init(key: key, keyID: keyID, teamID: teamID, defaultTopic: defaultTopic)
        keyDigest = digest
    }

    /// Whether `other` signs differently: another key file content, key id or team id.
    public func credentialsDiffer(from other: APNsConfiguration) -> Bool {
        keyDigest.isEmpty || keyDigest != other.keyDigest || keyID != other.keyID || teamID != other.teamID
    }

    /// This configuration with the signing material of `other` (key, key id, team id):
    /// what a reload replaces while the push loop runs.
    public func withCredentials(of other: APNsConfiguration) -> APNsConfiguration {
        var copy = self
        copy.key = other.key
        copy.keyID = other.keyID
        copy.teamID = other.teamID
        copy.keyDigest = other.keyDigest
        return copy
    }

    /// The shortest token lifetime Apple tolerates between two refreshes.
    public static let minimumTokenAge: Duration = .seconds(20 * 60)

    public func validate() throws(UsageError) {
        guard key.algorithm == .es256 else { throw UsageError("the APNs key must be an EC P-256 (.p8) key") }
        guard !keyID.isEmpty, keyID.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F && $0 != UInt8(ascii: "\"") && $0 != UInt8(ascii: "\\") }) else {
            throw UsageError("the APNs key id must be printable ASCII")
        }
        guard !teamID.isEmpty, teamID.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F && $0 != UInt8(ascii: "\"") && $0 != UInt8(ascii: "\\") }) else {
            throw UsageError("the APNs team id must be printable ASCII")
        }
        guard tokenRefreshInterval >= Self.minimumTokenAge, tokenRefreshInterval <= .seconds(50 * 60) else {
            throw UsageError("the APNs token refresh interval must be between 20 and 50 minutes")
        }
        for url in [productionURL, sandboxURL] {
            guard url.hasPrefix("https://") || url.hasPrefix("http://") else { throw UsageError("APNs endpoint '\(url)' must be an https:// URL") }
        }
    }
}

/// How the server reaches Firebase Cloud Messaging itself (HTTP v1). docs/PUSH.md, "FCM".
public struct FCMConfiguration: Sendable {
    public var account: ServiceAccount
    /// Where `/v1/projects/{project}/messages:send` is appended.
    public var messagesURL = "https://fcm.googleapis.com"
    /// Where the service-account assertion is exchanged for an access token (default: the
    /// account's `token_uri`).
    public var tokenURL: String
    /// An access token is replaced this long before it expires.
    public var tokenRefreshMargin: Duration = .seconds(300)

    public init(account: ServiceAccount) {
        self.account = account
        tokenURL = account.tokenURI
    }

    public func validate() throws(UsageError) {
        for url in [messagesURL, tokenURL] {
            guard url.hasPrefix("https://") || url.hasPrefix("http://") else { throw UsageError("FCM endpoint '\(url)' must be an https:// URL") }
        }
    }

    /// Whether `other` authenticates as another account or with another key (Google gives
    /// each new key of an account a new `private_key_id`).
    public func credentialsDiffer(from other: FCMConfiguration) -> Bool {
        account.privateKeyID.isEmpty || account.privateKeyID != other.account.privateKeyID
            || account.clientEmail != other.account.clientEmail || account.projectID != other.account.projectID
    }

    /// This configuration with the service account of `other`: what a reload replaces
    /// while the push loop runs. The endpoints stay (`tokenURL` too: it was fixed at start).
    public func withCredentials(of other: FCMConfiguration) -> FCMConfiguration {
        var copy = self
        copy.account = other.account
        return copy
    }

    /// The fields of a Google service-account key file the provider uses.
    public struct ServiceAccount: Sendable {
        public var projectID: String
        public var clientEmail: String
        public var privateKeyID: String
        public var key: JWTSigningKey
        public var tokenURI: String

        /// Reads a service-account JSON key file: at start and on each reload.
        public init(file path: String) throws(UsageError) {
            guard let text = readTextFile(path) else { throw UsageError("cannot read \(path)") }
            do throws(UsageError) {
                try self.init(json: Array(text.utf8))
            } catch {
                throw UsageError("\(path): \(error.message)")
            }
        }

        /// Parses a service-account JSON key file's contents.
        public init(json: [UInt8]) throws(UsageError) {
            struct File: Decodable {
                var type: String?
                var project_id: String
                var private_key_id: String?
                var private_key: String
                var client_email: String
                var token_uri: String?
            }
            let file: File
            do {
                file = try JSONDecoder().decode(File.self, from: Data(json))
            } catch {
                throw UsageError("not a service-account JSON key (needs project_id, private_key, client_email)")
            }
            if let type = file.type, type != "service_account" { throw UsageError("the JSON key is of type '\(type)', not service_account") }
            do {
                key = try JWTSigningKey(pem: file.private_key)
            } catch {
                throw UsageError("the service account's private_key: \(error)")
            }
            guard key.algorithm == .rs256 else { throw UsageError("the service account's private_key is not an RSA key") }
            projectID = file.project_id
            clientEmail = file.client_email
            privateKeyID = file.private_key_id ?? ""
            tokenURI = file.token_uri ?? "https://oauth2.googleapis.com/token"
            guard !projectID.isEmpty, projectID.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F && $0 != UInt8(ascii: "/") && $0 != UInt8(ascii: "?") && $0 != UInt8(ascii: "#") }) else {
                throw UsageError("the service account's project_id '\(projectID)' is not a plain id")
            }
        }
    }
}
