import Foundation
import SignalingSupport

/// Keys and certificates for the push tests, made with `openssl` in a temporary
/// directory: a test CA, a certificate for 127.0.0.1 signed by it, an EC P-256 `.p8` key
/// (APNs) and an RSA key in a service-account JSON (FCM), with their public halves.
public final class PushTestPKI: Sendable {
    public let directory: TemporaryDirectory
    public var caFile: String { directory.file("ca.pem") }
    public var serverCertificate: String { directory.file("server.pem") }
    public var serverKey: String { directory.file("server.key") }
    public var apnsKeyFile: String { directory.file("AuthKey_TESTKEY123.p8") }
    public var apnsPublicKey: String { directory.file("apns.pub") }
    public var fcmPublicKey: String { directory.file("fcm.pub") }
    public var serviceAccountFile: String { directory.file("service-account.json") }
    public static let apnsKeyID = "TESTKEY123"
    public static let apnsTeamID = "TEAM123456"
    public static let fcmProject = "voip-test-project"

    public init() throws {
        directory = try TemporaryDirectory("push-pki")
        let d = directory.path
        try Self.openssl(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
                          "-subj", "/CN=voip test CA", "-keyout", "\(d)/ca.key", "-out", "\(d)/ca.pem"])
        try Self.openssl(["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=127.0.0.1",
                          "-keyout", "\(d)/server.key", "-out", "\(d)/server.csr"])
        try "subjectAltName=IP:127.0.0.1,DNS:localhost\n".write(toFile: "\(d)/san.ext", atomically: true, encoding: .utf8)
        try Self.openssl(["x509", "-req", "-in", "\(d)/server.csr", "-CA", "\(d)/ca.pem", "-CAkey", "\(d)/ca.key",
                          "-CAcreateserial", "-days", "2", "-extfile", "\(d)/san.ext", "-out", "\(d)/server.pem"])
        try Self.openssl(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", apnsKeyFile])
        try Self.openssl(["pkey", "-in", apnsKeyFile, "-pubout", "-out", apnsPublicKey])
        try Self.openssl(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "\(d)/fcm.key"])
        try Self.openssl(["pkey", "-in", "\(d)/fcm.key", "-pubout", "-out", fcmPublicKey])
    }

    /// Another APNs key pair in the directory (a rotation's new key): the `.p8` and its
    /// public half.
    public func makeAPNsKey(named name: String) throws -> (privateKey: String, publicKey: String) {
        let (privateKey, publicKey) = (directory.file("\(name).p8"), directory.file("\(name).pub"))
        try Self.openssl(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", privateKey])
        try Self.openssl(["pkey", "-in", privateKey, "-pubout", "-out", publicKey])
        return (privateKey, publicKey)
    }

    /// Writes the service-account JSON with `tokenURI` (the mock's /token).
    public func writeServiceAccount(tokenURI: String) throws {
        let pem = try String(contentsOfFile: directory.file("fcm.key"), encoding: .utf8)
        let object: [String: String] = [
            "type": "service_account", "project_id": Self.fcmProject, "private_key_id": "key-1", "private_key": pem,
            "client_email": "push@\(Self.fcmProject).iam.gserviceaccount.com", "token_uri": tokenURI,
        ]
        try JSONSerialization.data(withJSONObject: object).write(to: URL(fileURLWithPath: serviceAccountFile))
    }

    static func openssl(_ arguments: [String]) throws {
        let errors = FileManager.default.temporaryDirectory.appendingPathComponent("openssl-\(getpid())-\(UInt32.random(in: 0...UInt32.max))").path
        defer { try? FileManager.default.removeItem(atPath: errors) }
        let process = try ChildProcess.spawn("/usr/bin/openssl", arguments: arguments, pipeInput: false, stdout: .discard, stderr: .file(errors))
        guard let status = process.waitForExit(timeoutSeconds: 60), status == 0 else {
            process.send(signal: SIGKILL)
            throw MockPushFailure("openssl \(arguments.joined(separator: " ")) failed: \((try? String(contentsOfFile: errors, encoding: .utf8)) ?? "")")
        }
    }
}

/// Tools/mock-push-service.py as a subprocess: APNs, FCM and the OAuth2 token endpoint
/// over HTTP/2 with TLS on a loopback port, checking signatures and bearer tokens and
/// recording every request.
public final class MockPushService {
    public let process: ChildProcess
    public let port: UInt16
    private let logPath: String
    private var consumed = 0
    private var lines: [[String: Any]] = []

    /// One request as the mock saw it.
    public struct Request {
        public var path: String
        public var headers: [String: String]
        public var body: String
        /// "ok": the JWT or bearer token checked out; "bad"; "none".
        public var auth: String
        /// Which APNs public key verified the provider token: 0 the PKI's, 1… the others.
        public var apnsKey: Int?
        public var jwtHeader: [String: Any]
        public var jwtClaims: [String: Any]
        public var connection: Int
        /// The HTTP/2 stream id on that connection.
        public var stream: Int
        /// The status answered (0: left unanswered, hanging).
        public var status: Int
        /// CLOCK_MONOTONIC ns when the mock had the whole request.
        public var receivedAt: UInt64
        public var json: [String: Any] { (try? JSONSerialization.jsonObject(with: Data(body.utf8))) as? [String: Any] ?? [:] }
    }

    /// - Parameter moreAPNsPublicKeys: public keys that also verify provider tokens, after
    ///   the PKI's (a rotation's new key); `Request.apnsKey` says which one verified.
    public init(pki: PushTestPKI, logName: String = "mock-push.log", moreAPNsPublicKeys: [String] = []) throws {
        logPath = pki.directory.file(logName)
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("Tools/mock-push-service.py").path
        process = try ChildProcess.spawn(
            "/usr/bin/python3",
            arguments: [script, "--cert", pki.serverCertificate, "--key", pki.serverKey, "--apns-public-key", pki.apnsPublicKey,
                        "--fcm-public-key", pki.fcmPublicKey] + moreAPNsPublicKeys.flatMap { ["--apns-public-key", $0] },
            pipeInput: true, stdout: .file(logPath), stderr: .file(logPath + ".err"))
        var found: UInt16?
        let deadline = Date().addingTimeInterval(20)
        var records: [[String: Any]] = []
        var consumedLines = 0
        while found == nil {
            guard Date() < deadline, process.poll() == nil else {
                let errors = (try? String(contentsOfFile: logPath + ".err", encoding: .utf8)) ?? ""
                throw MockPushFailure("the mock push service did not start: \(errors)")
            }
            records += Self.read(logPath, after: &consumedLines)
            found = records.lazy.compactMap { ($0["listening"] as? Int).map(UInt16.init) }.first
            if found == nil { usleep(10_000) }
        }
        port = found!
        lines = records
        consumed = consumedLines
    }

    deinit { stop() }

    public var baseURL: String { "https://127.0.0.1:\(port)" }

    public func stop() {
        process.closeInput()
        if process.waitForExit(timeoutSeconds: 5) == nil {
            process.send(signal: SIGKILL)
            _ = process.waitForExit(timeoutSeconds: 5)
        }
    }

    /// Sends a command (see the script's docstring) and waits for its acknowledgement.
    public func command(_ object: [String: Any]) throws {
        var data = try JSONSerialization.data(withJSONObject: object)
        data.append(0x0A)
        let written = data.withUnsafeBytes { write(process.input, $0.baseAddress, $0.count) }
        guard written == data.count else { throw MockPushFailure("cannot write to the mock push service") }
        let acks = lines.filter { $0["ack"] != nil }.count
        try waitFor("the mock's acknowledgement") { _ in self.lines.filter { $0["ack"] != nil }.count > acks }
    }

    /// Scripts answers for the next requests whose path starts with `match`.
    public func script(_ answers: [[String: Any]]) throws { try command(["script": answers]) }

    /// Every request so far, in arrival order.
    public var requests: [Request] {
        refresh()
        return lines.compactMap(Self.request)
    }

    /// Connections the mock accepted so far.
    public var connectionCount: Int {
        refresh()
        return lines.filter { $0["connection"] != nil }.count
    }

    /// The GOAWAY frames the mock sent (the `goaway` command): on which connection, and
    /// the last stream it declared answered.
    public var goAways: [(connection: Int, lastStreamID: Int)] {
        refresh()
        return lines.compactMap { line in
            guard let connection = line["goaway"] as? Int, let last = line["last_stream_id"] as? Int else { return nil }
            return (connection, last)
        }
    }

    /// Waits (bounded, 20 s) until `condition` holds on the requests so far; returns them.
    @discardableResult
    public func waitFor(_ what: String, timeout: Double = 20, _ condition: ([Request]) -> Bool) throws -> [Request] {
        let deadline = Date().addingTimeInterval(timeout)
        while true {
            let current = requests
            if condition(current) { return current }
            guard Date() < deadline else {
                throw MockPushFailure("timed out waiting for \(what); the mock saw \(current.map { "\($0.path) \($0.status)" })")
            }
            usleep(2_000)
        }
    }

    private func refresh() { lines += Self.read(logPath, after: &consumed) }

    private static func read(_ path: String, after consumed: inout Int) -> [[String: Any]] {
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { return [] }
        var all = text.split(separator: "\n", omittingEmptySubsequences: true)
        // A line still being written has no newline yet: leave it for the next read.
        if !text.hasSuffix("\n"), !all.isEmpty { all.removeLast() }
        guard all.count > consumed else { return [] }
        let fresh = all[consumed...].compactMap { (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: Any] }
        consumed = all.count
        return fresh
    }

    private static func request(_ line: [String: Any]) -> Request? {
        guard let path = line["path"] as? String else { return nil }
        let jwt = line["jwt"] as? [String: Any]
        return Request(
            path: path, headers: line["headers"] as? [String: String] ?? [:], body: line["body"] as? String ?? "",
            auth: line["auth"] as? String ?? "none", apnsKey: line["apns_key"] as? Int, jwtHeader: jwt?["header"] as? [String: Any] ?? [:],
            jwtClaims: jwt?["claims"] as? [String: Any] ?? [:], connection: line["conn"] as? Int ?? 0,
            stream: line["stream"] as? Int ?? 0,
            status: line["status"] as? Int ?? 0, receivedAt: (line["t"] as? NSNumber)?.uint64Value ?? 0)
    }
}

public struct MockPushFailure: Error, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}
