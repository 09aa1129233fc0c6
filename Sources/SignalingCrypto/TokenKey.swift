/// One signing key of device tokens: the id a token names and the secret behind it.
public struct TokenKey: Equatable, Sendable, CustomStringConvertible {
    /// The shortest secret accepted, in bytes: `openssl rand -hex 32` gives 64.
    public static let minimumSecretLength = 32

    public let id: String
    /// The UTF-8 bytes of the secret as written in the key file.
    public let secret: [UInt8]

    public init(id: String, secret: [UInt8]) throws(CryptoError) {
        guard DeviceToken.isValidKeyID(id) else { throw CryptoError("key id '\(id)' must be 1-64 characters from A-Z a-z 0-9 - _") }
        guard secret.count >= Self.minimumSecretLength else {
            throw CryptoError("the secret of key '\(id)' is \(secret.count) bytes; at least \(Self.minimumSecretLength) are required (openssl rand -hex 32)")
        }
        self.id = id
        self.secret = secret
    }

    /// Never prints the secret.
    public var description: String { "TokenKey(\(id))" }
}

/// The key file (`--auth-key-file`, docs/AUTH.md): one key a line, `KID SECRET`
/// separated by blanks; blank lines and lines starting with `#` are ignored, and so is
/// anything after a `#` that follows a blank. Key ids are unique. Order matters: the last
/// key is the one `voipserver token` signs with unless told otherwise (append a new key
/// to rotate).
public enum TokenKeyFile {
    /// The keys in `text`, in file order. A file with no key is an error: it would turn
    /// authentication off.
    public static func parse(_ text: String) throws(CryptoError) -> [TokenKey] {
        var keys: [TokenKey] = []
        for (index, rawLine) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            var fields: [Substring] = []
            for field in rawLine.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\r" }) {
                if field.hasPrefix("#") { break }
                fields.append(field)
            }
            guard !fields.isEmpty else { continue }
            guard fields.count == 2 else { throw CryptoError("line \(index + 1): expected 'KID SECRET'") }
            let key: TokenKey
            do {
                key = try TokenKey(id: String(fields[0]), secret: Array(fields[1].utf8))
            } catch {
                throw CryptoError("line \(index + 1): \(error.message)")
            }
            if keys.contains(where: { $0.id == key.id }) { throw CryptoError("line \(index + 1): key id '\(key.id)' appears twice") }
            keys.append(key)
        }
        guard !keys.isEmpty else { throw CryptoError("no keys (expected lines 'KID SECRET')") }
        return keys
    }
}
