/// Hands work produced off the loops' threads (the store writer's commits, the admin
/// API's operations) to the loops that own the connections concerned.
enum LoopDispatch {
    /// The loop tasks that carry out `effects`; wake-up requests go to the push gateway
    /// at once.
    static func tasks(for effects: [SwitchboardEffect], context: ServerContext) -> [LoopTask] {
        var tasks: [LoopTask] = []
        for effect in effects {
            switch effect {
            case .wake(let ref): tasks.append(.wake(ref))
            case .close(let ref, let frame): tasks.append(.close(ref, frame))
            case .wakeUp: context.requestWakeUp(effect)
            }
        }
        return tasks
    }

    /// Hands the tasks to their loops, one batch (one push onto its inbox, at most one
    /// eventfd write) per loop: posted one at a time, a busy loop would take the first of a
    /// commit's OKs alone and come back for the rest, each time between two requests.
    static func post(_ tasks: [LoopTask], to loops: [EventLoop]) {
        guard !tasks.isEmpty, !loops.isEmpty else { return }
        if loops.count == 1 {
            loops[0].post(contentsOf: tasks)
            return
        }
        var perLoop = [[LoopTask]](repeating: [], count: loops.count)
        for task in tasks {
            let loop = Int(task.loop)
            if loop < loops.count { perLoop[loop].append(task) }
        }
        for (loop, tasks) in zip(loops, perLoop) { loop.post(contentsOf: tasks) }
    }
}
