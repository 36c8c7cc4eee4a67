"""Dumps a GGUF file as gguf-py's GGUFReader reads it, as JSON on stdout.

tests/gguf/test_gguf*.cpp compare this with what rlx::gguf reads: keys in
order, each value's type list and leaf values as GGUFReader flattens them
(nested arrays flattened, types from the first element down, strings as hex),
and every tensor's name, type id, dims, absolute data offset, size and CRC-32.

    python tests/gguf/gguf_py_dump.py FILE.gguf
"""

import json
import sys
import zlib

import numpy as np
from gguf import GGUFReader, GGUFValueType


def leaves(field):
    is_string = field.types[-1] == GGUFValueType.STRING
    out = []
    for idx in field.data:
        part = field.parts[idx]
        if is_string:
            out.append(bytes(part.tobytes()).hex())
        else:
            v = part.tolist()[0]
            out.append(float(v) if isinstance(part.dtype.type(0), np.floating) else v)
    return out


def main(path):
    r = GGUFReader(path)
    fields = list(r.fields.values())
    version = int(fields[0].parts[-1][0])
    dump = {
        "version": version,
        # The first three fields are the header (GGUF.version, GGUF.tensor_count, GGUF.kv_count).
        "fields": [{"key": f.name, "types": [int(t) for t in f.types], "leaves": leaves(f)} for f in fields[3:]],
        "tensors": [
            {
                "name": t.name,
                "type": int(t.tensor_type),
                "dims": [int(d) for d in t.shape],
                "offset": int(t.data_offset),
                "nbytes": int(t.n_bytes),
                "crc32": zlib.crc32(np.ascontiguousarray(t.data).view(np.uint8).tobytes()),
            }
            for t in r.tensors
        ],
    }
    json.dump(dump, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
