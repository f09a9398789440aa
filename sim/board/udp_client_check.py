"""Run by board_bridge_tb in a separate process: the ``udp`` backend's transport
(:class:`treenic.driver.udp.BoardClient`, unchanged) against one simulated board behind a
real UDP socket on loopback.  Prints one JSON line; exit status 0 when every check held."""
import json
import sys

import numpy as np

from treenic.driver.udp import BoardClient
from treenic.hdl.nic import NicParams
from treenic.hdl.nic.params import ID_VALUE, Reg


def main(host, port, nic_json):
    p = NicParams(**json.loads(nic_json))
    c = BoardClient((host, int(port)), name="simulated board 0", timeout=20.0, retries=3)
    ident = int(c.read(int(Reg.ID), 1, "IDENTIFY")[0])
    params = int(c.read(int(Reg.PARAMS), 1, "IDENTIFY")[0])
    want = p.ports | p.lanes << 4 | (p.depth.bit_length() - 1) << 8 | p.max_entries << 16
    data = np.random.default_rng(5).integers(0, 1 << 32, 1000, dtype=np.uint64)
    c.write(p.buf_addr(0), data.astype(np.uint32), "WRITE_BUFFER")
    back = c.read(p.buf_addr(0), 1000, "READ_BUFFER")
    status = c.status()
    ok = ident == ID_VALUE and params == want and np.array_equal(back, data.astype(np.uint32))
    print(json.dumps({"ok": bool(ok), "id": hex(ident), "params": hex(params),
                      "buffer_words_checked": int(back.size), "status": list(status),
                      "retransmits": c.retransmits}), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
