#if canImport(Glibc)
import Glibc
#endif

/// The whole file as UTF-8 text, or nil when it cannot be read, is not UTF-8, or is
/// longer than 1 MiB (configuration files, secrets, /proc entries: never bulk data).
public func readTextFile(_ path: String) -> String? {
    guard let file = fopen(path, "r") else { return nil }
    defer { fclose(file) }
    var bytes: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 4096)
    while true {
        let count = fread(&chunk, 1, chunk.count, file)
        if count <= 0 { break }
        bytes += chunk[..<count]
        if bytes.count > 1 << 20 { return nil }
    }
    return String(validating: bytes, as: UTF8.self)
}
