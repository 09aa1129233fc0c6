import CSystemd
#if canImport(Glibc)
import Glibc
#endif

/// Tells the service manager (systemd, `Type=notify`) what the service is doing, through
/// libsystemd's `sd_notify` on the datagram socket named by `$NOTIFY_SOCKET`. Without that
/// variable (not started by systemd) every call does nothing, so the server calls these
/// unconditionally. See deploy/voipserver.service.
///
/// Cost: one datagram per call; called a handful of times per process life.
public enum ServiceManager {
    /// Whether a service manager listens (`$NOTIFY_SOCKET` is set).
    public static var isSupervised: Bool { getenv("NOTIFY_SOCKET") != nil }

    /// Startup or a reload is complete: the service accepts connections (`READY=1`).
    /// systemd considers a `Type=notify` unit started only once this arrives.
    @discardableResult
    public static func ready(status: String) -> Bool {
        notify("READY=1\nSTATUS=\(status)\nMAINPID=\(getpid())")
    }

    /// A reload (SIGHUP) has begun (`RELOADING=1`, with the monotonic time systemd 253+
    /// asks for); `ready` must follow when it is done.
    @discardableResult
    public static func reloading() -> Bool {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        let microseconds = UInt64(now.tv_sec) * 1_000_000 + UInt64(now.tv_nsec) / 1_000
        return notify("RELOADING=1\nMONOTONIC_USEC=\(microseconds)\nSTATUS=reloading")
    }

    /// Shutdown has begun (`STOPPING=1`): systemd waits for the exit, up to TimeoutStopSec.
    @discardableResult
    public static func stopping(status: String = "draining") -> Bool {
        notify("STOPPING=1\nSTATUS=\(status)")
    }

    /// A free-form status line (`systemctl status` shows it).
    @discardableResult
    public static func status(_ text: String) -> Bool {
        notify("STATUS=\(text)")
    }

    /// True when a service manager received the message.
    private static func notify(_ state: String) -> Bool {
        sd_notify(0, state) > 0
    }
}
