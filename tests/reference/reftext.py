"""The text format of tests/data/*_ref.txt (tests/test-util.h,
qkv_test_load_reference), shared by the reference scripts:

    tensor NAME f32|i32 RANK D0 D1 ...
    v0 v1 ...
"""
import sys

import torch


def emit(name, t, out=sys.stdout):
    """Write tensor t under name: i32 for integer tensors, else f32 with
    %.9g, which round-trips every float32 exactly."""
    t = t.detach()
    dtype = 'i32' if t.dtype in (torch.int32, torch.int64) else 'f32'
    dims = ''.join(' %d' % d for d in t.shape)
    out.write(f'tensor {name} {dtype} {t.dim()}{dims}\n')
    flat = t.reshape(-1).tolist()
    if dtype == 'i32':
        out.write(' '.join(str(int(v)) for v in flat) + '\n')
    else:
        out.write(' '.join('%.9g' % v for v in flat) + '\n')
