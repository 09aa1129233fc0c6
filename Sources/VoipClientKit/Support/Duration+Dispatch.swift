import Foundation
import SignalingSupport

extension Duration {
    /// For `DispatchQueue.asyncAfter` and semaphore waits.
    var dispatchInterval: DispatchTimeInterval { .nanoseconds(Int(min(seconds * 1e9, 1e15))) }
}
