import SignalingSupport

/// The background execution model as a state machine: application state, background
/// tasks and their allowance, wake slices. The client feeds it events and the time and
/// carries out the actions it returns. Owned by the client's queue.
///
/// Rules:
/// - foreground: tasks may begin, no deadline; `timeRemaining` is `.greatestFiniteMagnitude`;
/// - entering the background or a wake grants `wakeSlice`; the first task begun in a
///   background period (or running when it starts) fixes its allowance's end at
///   `taskAllowance` from then; all tasks share it;
/// - `expirationWarning` before that end every running task's expiration handler runs
///   once; at the end tasks still running are ended by the system (`taskExpired`);
/// - when neither the slice nor a task holds time, the app is suspended; a suspended app
///   cannot begin tasks (`.invalid`), and only a wake makes it run again;
/// - returning to the foreground ends running tasks (their expiration handlers do not run).
struct BackgroundExecution {
    enum Action: Equatable {
        case stateChanged(ApplicationState)
        /// Run this task's expiration handler (once).
        case runExpirationHandler(BackgroundTaskIdentifier)
        /// The allowance ran out with the task still running; the system ended it.
        case taskExpired(BackgroundTaskIdentifier, name: String)
        /// The app was woken.
        case woken(WakeReason)
    }

    private struct Task {
        var name: String
        var warned = false
    }

    let policy: BackgroundExecutionPolicy
    private(set) var state: ApplicationState = .foreground
    private var tasks: [Int: Task] = [:]
    private var nextIdentifier = 1
    /// End of the current wake / entry slice.
    private var sliceEnd: Instant?
    /// End of the task allowance of this background period.
    private var allowanceEnd: Instant?

    init(policy: BackgroundExecutionPolicy) { self.policy = policy }

    var runningTasks: [BackgroundTaskIdentifier] { tasks.keys.sorted().map(BackgroundTaskIdentifier.init(rawValue:)) }

    func timeRemaining(now: Instant) -> Double {
        switch state {
        case .foreground: return .greatestFiniteMagnitude
        case .suspended: return 0
        case .background:
            let end = [sliceEnd, tasks.isEmpty ? nil : allowanceEnd].compactMap { $0 }.max() ?? now
            return (end - now).seconds
        }
    }

    var nextDeadline: Instant? {
        guard state == .background else { return nil }
        var deadlines: [Instant] = []
        if let sliceEnd { deadlines.append(sliceEnd) }
        if let allowanceEnd, !tasks.isEmpty {
            deadlines.append(allowanceEnd)
            if tasks.values.contains(where: { !$0.warned }) {
                deadlines.append(Instant(nanoseconds: allowanceEnd.nanoseconds - min(allowanceEnd.nanoseconds, UInt64(policy.expirationWarning.seconds * 1e9))))
            }
        }
        return deadlines.min()
    }

    mutating func enterForeground(now: Instant) -> [Action] {
        guard state != .foreground else { return [] }
        tasks.removeAll()
        sliceEnd = nil
        allowanceEnd = nil
        state = .foreground
        return [.stateChanged(.foreground)]
    }

    mutating func enterBackground(now: Instant) -> [Action] {
        guard state == .foreground else { return [] }
        state = .background
        sliceEnd = now + policy.wakeSlice
        allowanceEnd = tasks.isEmpty ? nil : now + policy.taskAllowance
        return [.stateChanged(.background)] + tick(now: now)
    }

    /// One of the three wake reasons. Suspended → background with a fresh slice; already
    /// running in the background → the slice is extended; foreground → nothing to do.
    mutating func wake(_ reason: WakeReason, now: Instant) -> [Action] {
        switch state {
        case .foreground:
            return []
        case .background:
            sliceEnd = max(sliceEnd ?? now, now + policy.wakeSlice)
            return [.woken(reason)]
        case .suspended:
            state = .background
            sliceEnd = now + policy.wakeSlice
            allowanceEnd = nil
            return [.stateChanged(.background), .woken(reason)]
        }
    }

    mutating func beginTask(name: String, now: Instant) -> BackgroundTaskIdentifier {
        if state == .suspended { return .invalid }
        if state == .background {
            if let end = allowanceEnd, !tasks.isEmpty, now >= end { return .invalid }
            if tasks.isEmpty || allowanceEnd == nil { allowanceEnd = now + policy.taskAllowance }
        }
        let identifier = nextIdentifier
        nextIdentifier += 1
        tasks[identifier] = Task(name: name)
        return BackgroundTaskIdentifier(rawValue: identifier)
    }

    /// Ends a task; unknown, already ended and `.invalid` identifiers are ignored.
    mutating func endTask(_ identifier: BackgroundTaskIdentifier, now: Instant) -> [Action] {
        guard tasks.removeValue(forKey: identifier.rawValue) != nil else { return [] }
        if tasks.isEmpty { allowanceEnd = nil }
        return tick(now: now)
    }

    func isRunning(_ identifier: BackgroundTaskIdentifier) -> Bool { tasks[identifier.rawValue] != nil }

    mutating func tick(now: Instant) -> [Action] {
        guard state == .background else { return [] }
        var actions: [Action] = []
        if let end = allowanceEnd, !tasks.isEmpty {
            let warningAt = Instant(nanoseconds: end.nanoseconds - min(end.nanoseconds, UInt64(policy.expirationWarning.seconds * 1e9)))
            if now >= warningAt {
                for key in tasks.keys.sorted() where !tasks[key]!.warned {
                    tasks[key]!.warned = true
                    actions.append(.runExpirationHandler(BackgroundTaskIdentifier(rawValue: key)))
                }
            }
            if now >= end {
                for key in tasks.keys.sorted() {
                    actions.append(.taskExpired(BackgroundTaskIdentifier(rawValue: key), name: tasks[key]!.name))
                }
                tasks.removeAll()
                allowanceEnd = nil
            }
        }
        let sliceOver = sliceEnd.map { now >= $0 } ?? true
        if sliceOver && tasks.isEmpty {
            state = .suspended
            sliceEnd = nil
            allowanceEnd = nil
            actions.append(.stateChanged(.suspended))
        }
        return actions
    }
}
