import SignalingStore

extension SignalingServer {
    public func enableRelay(over link: any NodeLink) {}
    public func receive(_ event: NodeLinkEvent) {}
}
