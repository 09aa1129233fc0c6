// Placeholder until the network-namespace test lands (see the next commits).
print("signaling-client-probe: not implemented yet")
