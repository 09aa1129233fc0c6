#if canImport(Glibc)
import Glibc
#endif

func writeFile(_ path: String, _ text: String) -> Bool {
    guard let file = fopen(path, "w") else { return false }
    defer { fclose(file) }
    return fputs(text, file) >= 0
}

func removeFile(_ path: String) { unlink(path) }
