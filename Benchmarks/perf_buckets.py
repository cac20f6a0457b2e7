#!/usr/bin/env python3
"""Where a relayed request's CPU time goes, from a `perf record -g` of Gatehouse.

    perf script -i perf.data -F comm,tid,ip,sym,dso --no-demangle | python3 perf_buckets.py [--requests N --cpu-us U]

Each sample's call chain (leaf first) is put in one bucket:

- kernel samples by the system call (or interrupt) they are under: the first user-space frame
  above the kernel frames (read, writev, write, epoll_wait, ...);
- user-space samples by the innermost frame that names a known part (the fast path's planner,
  NIO's HTTP parser and encoders, the relay handlers, the pipeline...), else "other".

The table gives each bucket's share of the samples and, with --requests (requests served
during the recording) and --cpu-us (Gatehouse's CPU time during it, in microseconds), the
microseconds per request it stands for. Standard library only.
"""

import argparse
import re
import sys
from collections import Counter

# (bucket, pattern on the mangled symbol), innermost match wins; order breaks ties in one frame.
USER_PARTS = [
    ("NIO HTTP parser (llhttp + HTTPDecoder: request and response heads)", re.compile(r"llhttp|BetterHTTPParser|HTTPDecoder")),
    ("NIO HTTP encoders (request to backend, response to app)", re.compile(r"HTTPRequestEncoder|HTTPResponseEncoder|writeHeaders|ByteBuffer.*headers")),
    ("NIO TLS (NIOSSL, BoringSSL)", re.compile(r"NIOSSL|CNIOBoringSSL|boringssl|bssl")),
    ("fast path: planner (admission, identity cache, rule, outbound headers)", re.compile(r"FastRelayPlanner|ReloadablePlanner|RelayAdmission|RelayHeaderPolicy|IdentityCache|RelayForwarding|RequestIDGenerator|NIORelayHead|SessionViewCache")),
    ("fast path: exchange (handler, pool, response head, metrics)", re.compile(r"FastRelayHandler|BackendExchangeHandler|BackendConnectionPool|LoopPool|LazyTimer|RelayRouteMetrics")),
    ("connection edge (timeouts, framing checks)", re.compile(r"ConnectionEdge|EdgeByteObserver")),
    ("NIO channel pipeline and socket I/O bookkeeping", re.compile(r"ChannelPipeline|ChannelHandlerContext|BaseSocketChannel|BaseStreamSocketChannel|PendingWrites|NIOAny|ByteToMessageHandler")),
    ("NIO event loop (selector, scheduled tasks)", re.compile(r"SelectableEventLoop|Selector|EventLoop")),
]
SYSCALL_NAMES = re.compile(r"^(__GI___)?(libc_)?(readv|read|writev|write|epoll_wait|epoll_ctl|accept4?|close|recvmsg|sendmsg|connect|eventfd_write|futex)")


def chains(stream):
    """Yields the frames of each sample: [(symbol, dso)], leaf first."""
    frames = []
    for line in stream:
        line = line.rstrip("\n")
        if not line.strip():
            if frames:
                yield frames
            frames = []
            continue
        if not line.startswith((" ", "\t")):
            continue  # the sample's header line (comm, tid)
        parts = line.strip().split(None, 1)
        if len(parts) < 2:
            continue
        rest = parts[1]
        match = re.match(r"(.*) \((.*)\)$", rest)
        symbol, dso = (match.group(1), match.group(2)) if match else (rest, "")
        symbol = re.sub(r"\+0x[0-9a-f]+$", "", symbol)
        frames.append((symbol, dso))
    if frames:
        yield frames


def bucket(frames):
    if frames and ("kernel" in frames[0][1] or frames[0][0].startswith("[k]")):
        for symbol, dso in frames:
            if "kernel" in dso:
                continue
            name = SYSCALL_NAMES.match(symbol)
            return "kernel: " + (name.group(3) if name else "interrupts and scheduling")
        return "kernel: interrupts and scheduling"
    for symbol, _ in frames:
        for name, pattern in USER_PARTS:
            if pattern.search(symbol):
                return name
    return "other user space (Swift runtime, allocator, unattributed)"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=float, help="requests served during the recording")
    parser.add_argument("--cpu-us", type=float, help="Gatehouse's CPU time during the recording, in microseconds")
    args = parser.parse_args()
    counts = Counter(bucket(frames) for frames in chains(sys.stdin))
    total = sum(counts.values())
    if not total:
        sys.exit("perf_buckets: no samples on standard input")
    per_request = args.cpu_us / args.requests if args.requests and args.cpu_us else None
    header = "| where | share of samples |" + (" µs per request |" if per_request else "")
    print(header)
    print("|---|---:|" + ("---:|" if per_request else ""))
    kernel = sum(n for name, n in counts.items() if name.startswith("kernel"))
    for name, n in counts.most_common():
        share = n / total
        row = f"| {name} | {share:.1%} |"
        if per_request:
            row += f" {share * per_request:.2f} |"
        print(row)
    total_row = f"| **all** ({total} samples; kernel {kernel / total:.0%}, user space {1 - kernel / total:.0%}) | 100% |"
    if per_request:
        total_row += f" {per_request:.2f} |"
    print(total_row)


if __name__ == "__main__":
    main()
