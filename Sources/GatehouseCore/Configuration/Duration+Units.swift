extension Duration {
    /// The whole duration in nanoseconds (for NIO's `TimeAmount` and deadlines).
    public var inNanoseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }

    /// The whole duration in milliseconds.
    public var inMilliseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1000 + attoseconds / 1_000_000_000_000_000
    }

    /// The duration in seconds (for `Date` arithmetic).
    public var inSeconds: Double {
        let (seconds, attoseconds) = components
        return Double(seconds) + Double(attoseconds) / 1e18
    }
}
