import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

/// The settings of the controlling terminal, saved when raw mode starts so they can be
/// put back on every way out, including `exit` from another thread (atexit).
nonisolated(unsafe) private var savedTerminalSettings: termios?

/// The terminal the interactive console draws on: raw mode (keys arrive one by one, no
/// echo, Ctrl-C is a key) and its width.
enum TerminalDevice {
    static func isTerminal(_ fd: Int32) -> Bool { isatty(fd) == 1 }

    /// Raw input on `fd`: no line buffering, no echo, no signals from keys, no flow
    /// control, CR not turned into LF. Output processing stays on, so "\n" still starts
    /// a new line. The old settings come back with `restore` or at exit.
    static func enterRawMode(_ fd: Int32) throws(SystemError) {
        var settings = termios()
        guard tcgetattr(fd, &settings) == 0 else { throw SystemError("tcgetattr", errno) }
        if savedTerminalSettings == nil {
            savedTerminalSettings = settings
            atexit { TerminalDevice.restore(0) }
        }
        settings.c_lflag &= ~tcflag_t(ECHO | ICANON | IEXTEN | ISIG)
        settings.c_iflag &= ~tcflag_t(IXON | ICRNL | INLCR | BRKINT | ISTRIP)
        withUnsafeMutableBytes(of: &settings.c_cc) { cc in
            cc[Int(VMIN)] = 1
            cc[Int(VTIME)] = 0
        }
        guard tcsetattr(fd, TCSAFLUSH, &settings) == 0 else { throw SystemError("tcsetattr", errno) }
    }

    /// Puts back the settings saved by `enterRawMode` (harmless when there are none).
    static func restore(_ fd: Int32) {
        guard var settings = savedTerminalSettings else { return }
        _ = tcsetattr(fd, TCSAFLUSH, &settings)
    }

    /// Columns of the terminal on `fd`; 80 when it cannot tell.
    static func columns(_ fd: Int32) -> Int {
        var size = winsize()
        guard ioctl(fd, UInt(TIOCGWINSZ), &size) == 0, size.ws_col > 0 else { return 80 }
        return Int(size.ws_col)
    }
}
