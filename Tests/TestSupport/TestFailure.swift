/// An error a test throws when a set-up step it depends on did not happen (the condition
/// it waited for never came), so the test stops there with a message instead of going on
/// against a state it did not reach.
public struct TestFailure: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}
