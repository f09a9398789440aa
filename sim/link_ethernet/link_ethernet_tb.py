"""cocotb side of sim/link_ethernet (see test_link_ethernet.py)."""
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, ReadOnly, RisingEdge

from harness import bench_params, bench_seed
from treenic.hdl.link.ethernet import WORDS_PER_FLIT, _ip, decode_datagram, encode_datagram
from treenic.hdl.link.flit import FlitType
from treenic.hdl.nic import NicParams

OUR_IP = "10.0.0.1"
END = {FlitType.SUB_TAIL, FlitType.MSG_TAIL, FlitType.TAIL, FlitType.HEAD_TAIL}


def sig(dut, name):
    return getattr(dut, name)


def pack_rx(data, last, length, peer):
    return data | (last << 32) | (length << 33) | (peer << 49)


async def setup(dut):
    p = bench_params()
    rng = random.Random(bench_seed())
    fmt = NicParams(**p["nic"]).fmt
    for name in ("rx__valid", "rx__payload", "tx__ready", "i__0__valid", "i__1__valid",
                 "o__0__credit", "o__1__credit"):
        sig(dut, name).value = 0
    cocotb.start_soon(Clock(dut.clk, 8, unit="ns").start())
    dut.rst.value = 1
    for _ in range(3):
        await RisingEdge(dut.clk)
    dut.rst.value = 0
    return p, rng, fmt


def random_flit(fmt, rng):
    t = rng.choice(list(FlitType) + [FlitType.SUB_BODY] * 4)
    return (fmt.make_flit(t, 0, rng.getrandbits(fmt.width)), rng.getrandbits(16))


@cocotb.test()
async def send(dut):
    """Flits from both ports -> datagrams (bench decodes them as the peers would); the
    peers return credits in credit-only datagrams; the local NIC frees credits at random."""
    p, rng, fmt = await setup(dut)
    credits = NicParams(**p["nic"]).credits
    peers, P = p["peers"], 2
    sent = [[] for _ in range(P)]
    got = [[] for _ in range(P)]
    have = [credits] * P                       # our credits at each peer
    freed = [0] * P                            # credits our NIC gave back (o.credit)
    paid = [0] * P                             # credits the datagrams carried
    words, returns = [], []                    # datagram in progress; credit datagrams
    rx_words = []
    datagrams = 0
    cycle = 0
    ready, rx_taken = 0, False
    while cycle < 60000:
        await FallingEdge(dut.clk)
        cycle += 1
        # our flits (credit discipline per port), consumed at the coming rising edge
        for j in range(P):
            go = len(sent[j]) < p["flits"] and have[j] > 0 and rng.random() < 0.4
            sig(dut, f"i__{j}__valid").value = int(go)
            if go:
                f = random_flit(fmt, rng)
                if len(sent[j]) == p["flits"] - 1:   # a message ends with its tail flit
                    f = (fmt.make_flit(FlitType.MSG_TAIL, 0, f[0] & ((1 << fmt.width) - 1)),
                         f[1])
                sig(dut, f"i__{j}__flit").value, sig(dut, f"i__{j}__crc").value = f
                sent[j].append(f)
                have[j] -= 1
            c = int(rng.random() < 0.05)
            sig(dut, f"o__{j}__credit").value = c
            freed[j] += c
        ready = int(rng.random() < 0.7)
        dut.tx__ready.value = ready
        # credit datagrams from the peers into rx
        if rx_taken:
            rx_words.pop(0)
        if not rx_words and returns:
            r = returns.pop(0)
            src = r.pop()
            rx_words = [pack_rx(w, int(k == len(r) - 1), 4 * len(r), _ip(peers[src][0]))
                        for k, w in enumerate(r)]
        dut.rx__valid.value = int(bool(rx_words))
        if rx_words:
            dut.rx__payload.value = rx_words[0]
        await ReadOnly()
        rx_taken = bool(rx_words) and bool(int(dut.rx__ready.value))
        for j in range(P):
            have[j] += int(sig(dut, f"i__{j}__credit").value)
        if int(dut.tx__valid.value) and ready:
            v = int(dut.tx__payload.value)
            words.append((v & 0xFFFF_FFFF, (v >> 33) & 0xFFFF, (v >> 49) & 0xFFFF_FFFF))
            if (v >> 32) & 1:
                datagrams += 1
                got_d = check_datagram(fmt, p, words, datagrams)
                src = got_d["src"]
                got[src] += got_d["flits"]
                paid[src] += got_d["credits"]
                # the peer gives back a credit per flit, in its own credit-only datagram
                if got_d["flits"]:
                    returns.append(encode_datagram(fmt, dst_port=src,
                                                   src_port=peers[src][1],
                                                   credits=[len(got_d["flits"])]) + [src])
                words = []
        if all(len(s) == p["flits"] for s in sent) and got == sent and \
                paid == freed and not returns and not rx_words and cycle % 500 == 0:
            break
    assert got == sent, f"flits per port differ: sent {list(map(len, sent))}, " \
                        f"got {list(map(len, got))}"
    assert paid == freed, f"credits carried {paid} != freed {freed}"
    assert int(dut.dropped.value) == 0 and int(dut.overflow.value) == 0
    dut._log.info(f"{sum(map(len, sent))} flits in {datagrams} datagrams")


def check_datagram(fmt, p, words, k):
    """A datagram our board sent, decoded as its peer would: flits, credits, our port."""
    peers = p["peers"]
    w0 = words[0][0]
    src = (w0 >> 28) & 0xF
    assert src < len(peers), f"datagram {k}: source port {src}"
    assert len({(ln, ip) for _, ln, ip in words}) == 1, "length/peer changed in a datagram"
    assert words[0][2] == _ip(peers[src][0]), f"datagram {k}: wrong destination"
    view = [("0.0.0.0", 15)] * (peers[src][1] + 1)   # the peer's ports: this one is ours
    view[peers[src][1]] = (OUR_IP, src)
    d = decode_datagram(fmt, [w for w, _, _ in words], length=words[0][1], src_ip=OUR_IP,
                        peers=view, max_flits=p["max_flits"])
    assert d is not None, f"the peer would drop datagram {k}: {words}"
    fl = d[2]
    assert len(words) == 2 + WORDS_PER_FLIT * len(fl)
    assert not fl or len(fl) == p["max_flits"] or fmt.split_flit(fl[-1][0])[0] in END, \
        f"datagram {k} does not end a sub-packet"
    return {"src": src, "flits": fl, "credits": d[1][0]}


def malformed(fmt, rng, peers, max_flits):
    """A random datagram (words, src ip, length) and whether it is well formed."""
    j = rng.randrange(2)
    flits = [random_flit(fmt, rng) for _ in range(rng.randrange(0, max_flits + 1))]
    words = encode_datagram(fmt, dst_port=j, src_port=peers[j][1], flits=flits,
                            credits=[rng.randrange(4)])
    ip, length = _ip(peers[j][0]), 4 * len(words)
    kind = rng.choice(["ok"] * 6 + ["magic", "version", "ip", "srcport", "dst", "length",
                                    "short", "long", "toomany"])
    if kind == "magic":
        words[0] ^= 1 << rng.randrange(16)
    elif kind == "version":
        words[0] ^= 1 << 16
    elif kind == "ip":
        ip ^= 1 << rng.randrange(32)
    elif kind == "srcport":
        words[0] ^= 1 << 28
    elif kind == "dst":
        words[0] = (words[0] & ~(0xF << 24)) | (2 << 24)
    elif kind == "length":
        length += 4 * rng.choice([-1, 1])
    elif kind == "short" and len(words) > 3:
        words = words[:rng.randrange(2, len(words))]    # ends early: a prefix delivered
    elif kind == "long":
        words += [rng.getrandbits(32) for _ in range(rng.randrange(1, 5))]
        length = 4 * len(words)
    elif kind == "toomany":
        words[1] = (words[1] & ~0xFF) | (max_flits + 1)
    return words, ip, length


@cocotb.test()
async def receive(dut):
    """Random datagrams, more than half of them malformed, with gaps: the delivered flits, credit
    pulses and dropped count equal the golden receiver's."""
    p, rng, fmt = await setup(dut)
    peers, P = p["peers"], 2
    view = [(ip, port) for ip, port in peers]
    want, want_credits, want_dropped = [[] for _ in range(P)], [0] * P, 0
    queue = []
    for _ in range(p["datagrams"]):
        words, ip, length = malformed(fmt, rng, peers, p["max_flits"])
        d = decode_datagram(fmt, words, length=length, src_ip=ip, peers=view,
                            max_flits=p["max_flits"])
        if d is None:
            want_dropped += 1
        else:
            want[d[0]] += d[2]
            want_credits[d[0]] += d[1][0]
        queue += [pack_rx(w, int(k == len(words) - 1), length, ip)
                  for k, w in enumerate(words)]
    got, credits = [[] for _ in range(P)], [0] * P
    idle, taken = 0, False
    while queue or idle < 300:
        await FallingEdge(dut.clk)
        if taken:                                  # consumed at the last rising edge
            queue.pop(0)
        go = bool(queue) and rng.random() < 0.8
        dut.rx__valid.value = int(go)
        if go:
            dut.rx__payload.value = queue[0]
        idle = 0 if queue else idle + 1
        await ReadOnly()                           # outputs for the coming rising edge
        taken = go and bool(int(dut.rx__ready.value))
        for j in range(P):
            if int(sig(dut, f"o__{j}__valid").value):
                got[j].append((int(sig(dut, f"o__{j}__flit").value),
                               int(sig(dut, f"o__{j}__crc").value)))
            credits[j] += int(sig(dut, f"i__{j}__credit").value)
    for j in range(P):
        bad = [k for k, (a, b) in enumerate(zip(got[j], want[j])) if a != b]
        if bad:
            k = bad[0]
            dut._log.error(f"port {j}: {len(bad)} differ, first {k}: got {got[j][k][0]:x} "
                           f"{got[j][k][1]:x} want {want[j][k][0]:x} {want[j][k][1]:x}; "
                           f"got in want: {got[j][k] in want[j]}")
    assert got == want, f"flits per port: got {list(map(len, got))}, " \
                        f"golden {list(map(len, want))}"
    assert credits == want_credits, f"credits {credits} != golden {want_credits}"
    assert int(dut.dropped.value) == want_dropped, \
        f"dropped {int(dut.dropped.value)} != golden {want_dropped}"
    dut._log.info(f"{p['datagrams']} datagrams, {want_dropped} malformed dropped, "
                  f"{sum(map(len, got))} flits delivered")
