import Foundation

/// A throw-away certificate authority and a server certificate it signed, made with the
/// real `openssl` command into a temporary directory: what the TLS tests (device port,
/// clients, mock push services) trust and serve.
///
/// The server certificate names `localhost` and `127.0.0.1` (P-256 keys, valid for a day).
/// `makeServer(named:)` issues more, e.g. one for another name or a second key for a reload.
public final class TestCertificates: Sendable {
    public let directory: TemporaryDirectory
    /// The CA's certificate (PEM): what a client trusts.
    public let caFile: String
    /// The server's chain (leaf then nothing else: the CA is the trust anchor) and key.
    public let serverChainFile: String
    public let serverKeyFile: String

    public init() throws {
        directory = try TemporaryDirectory("voip-tls")
        caFile = directory.file("ca.pem")
        serverChainFile = directory.file("server.pem")
        serverKeyFile = directory.file("server.key")
        try Self.openssl(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                          "-keyout", directory.file("ca.key"), "-out", caFile, "-days", "1", "-subj", "/CN=voip test CA",
                          "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign"])
        try issue(name: "localhost", addresses: ["127.0.0.1"], chain: serverChainFile, key: serverKeyFile)
    }

    /// Issues another server certificate signed by this CA; returns (chain, key) paths.
    public func makeServer(named name: String, addresses: [String] = [], file: String) throws -> (chain: String, key: String) {
        let chain = directory.file(file + ".pem"), key = directory.file(file + ".key")
        try issue(name: name, addresses: addresses, chain: chain, key: key)
        return (chain, key)
    }

    /// The SHA-256 of a certificate's SubjectPublicKeyInfo, in hex: what a pin names.
    public func publicKeySHA256(ofCertificate file: String) throws -> String {
        let script = "openssl x509 -in '\(file)' -pubkey -noout | openssl pkey -pubin -outform der | openssl dgst -sha256 -r"
        let run = try ExecutableRun.runProgram("/bin/sh", ["-c", script], timeoutSeconds: 30)
        guard run.status == 0, let hex = run.stdout.split(separator: " ").first else {
            throw Failure("openssl could not hash \(file): \(run.stderr)")
        }
        return String(hex)
    }

    private func issue(name: String, addresses: [String], chain: String, key: String) throws {
        let request = key + ".csr", extensions = key + ".ext"
        let names = (["DNS:\(name)"] + addresses.map { "IP:\($0)" }).joined(separator: ",")
        try "subjectAltName=\(names)\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
            .write(toFile: extensions, atomically: true, encoding: .utf8)
        try Self.openssl(["req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                          "-keyout", key, "-out", request, "-subj", "/CN=\(name)"])
        try Self.openssl(["x509", "-req", "-in", request, "-CA", caFile, "-CAkey", directory.file("ca.key"),
                          "-CAcreateserial", "-out", chain, "-days", "1", "-extfile", extensions])
    }

    private static func openssl(_ arguments: [String]) throws {
        let run = try ExecutableRun.runProgram("/usr/bin/openssl", arguments, timeoutSeconds: 60)
        guard run.status == 0 else { throw Failure("openssl \(arguments.first ?? "") failed: \(run.stderr)") }
    }

    public struct Failure: Error, CustomStringConvertible {
        public let description: String
        init(_ description: String) { self.description = description }
    }
}
