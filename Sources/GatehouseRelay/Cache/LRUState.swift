import GatehouseCore

/// A least-recently-used map from `TokenKey` to a resolution, in two flat arrays: a hash
/// index and a slot array threaded into a doubly linked list by index (no per-entry object).
///
/// The index is keyed by the key's first 64 bits only (12 bytes a bucket instead of 36) and the
/// slot holds the whole key: a lookup whose full key differs is a miss, and two live tokens
/// sharing 64 bits (odds about 1 in 10^13 at a million entries) only evict each other.
struct LRUState {
    private struct Slot {
        var key: TokenKey
        var value: IdentityResolution
        var expiry: Int64
        var previous: Int32
        var next: Int32
    }

    private static let none: Int32 = -1
    let capacity: Int
    private(set) var index: [UInt64: Int32] = [:]
    private var slots: [Slot] = []
    private var freeSlots: [Int32] = []
    private var head: Int32 = none  // most recently used
    private var tail: Int32 = none  // least recently used
    var inflight: [TokenKey: Task<Result<IdentityResolution, IdentityUnavailable>, Never>] = [:]

    init(capacity: Int) {
        self.capacity = capacity
    }

    /// The live value for `key`, marked most recently used; expired entries are removed.
    mutating func get(_ key: TokenKey, now: Int64) -> IdentityResolution? {
        guard let slot = index[key.words.0], slots[Int(slot)].key == key else { return nil }
        guard slots[Int(slot)].expiry > now else {
            remove(key)
            return nil
        }
        moveToFront(slot)
        return slots[Int(slot)].value
    }

    /// Stores `value`; returns whether the least recently used entry was evicted to make room.
    @discardableResult
    mutating func set(_ key: TokenKey, _ value: IdentityResolution, expiry: Int64) -> Bool {
        if let slot = index[key.words.0] {
            slots[Int(slot)].key = key
            slots[Int(slot)].value = value
            slots[Int(slot)].expiry = expiry
            moveToFront(slot)
            return false
        }
        var evicted = false
        if index.count >= capacity, tail != Self.none {
            remove(slots[Int(tail)].key)
            evicted = true
        }
        let entry = Slot(key: key, value: value, expiry: expiry, previous: Self.none, next: head)
        let slot: Int32
        if let reused = freeSlots.popLast() {
            slot = reused
            slots[Int(slot)] = entry
        } else {
            slot = Int32(slots.count)
            slots.append(entry)
        }
        if head != Self.none { slots[Int(head)].previous = slot }
        head = slot
        if tail == Self.none { tail = slot }
        index[key.words.0] = slot
        return evicted
    }

    mutating func remove(_ key: TokenKey) {
        guard let slot = index[key.words.0], slots[Int(slot)].key == key else { return }
        index[key.words.0] = nil
        unlink(slot)
        slots[Int(slot)].value = .inactive  // release the identity now
        freeSlots.append(slot)
    }

    private mutating func moveToFront(_ slot: Int32) {
        guard head != slot else { return }
        unlink(slot)
        slots[Int(slot)].previous = Self.none
        slots[Int(slot)].next = head
        if head != Self.none { slots[Int(head)].previous = slot }
        head = slot
        if tail == Self.none { tail = slot }
    }

    private mutating func unlink(_ slot: Int32) {
        let previous = slots[Int(slot)].previous
        let next = slots[Int(slot)].next
        if previous != Self.none { slots[Int(previous)].next = next } else if head == slot { head = next }
        if next != Self.none { slots[Int(next)].previous = previous } else if tail == slot { tail = previous }
        slots[Int(slot)].previous = Self.none
        slots[Int(slot)].next = Self.none
    }
}
