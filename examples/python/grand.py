"""grand.py: GLib's GRand (MT19937, seeded as g_rand_new_with_seed()), so
Python draws the numbers the C examples draw from the same seed. GRand is
not introspectable (GLib's GIR leaves it out), hence this port of
glib/grand.c (GLib >= 2.2 seeding and int_range)."""

N, M = 624, 397
MATRIX_A, UPPER, LOWER = 0x9908B0DF, 0x80000000, 0x7FFFFFFF
DOUBLE_TRANSFORM = 2.3283064365386962890625e-10  # 1 / 2^32


class GRand:
    def __init__(self, seed):
        mt = [seed & 0xFFFFFFFF]
        for i in range(1, N):
            mt.append((1812433253 * (mt[i - 1] ^ (mt[i - 1] >> 30)) + i) & 0xFFFFFFFF)
        self.mt, self.mti = mt, N

    def int(self):
        mt = self.mt
        if self.mti >= N:
            for kk in range(N):
                y = (mt[kk] & UPPER) | (mt[(kk + 1) % N] & LOWER)
                mt[kk] = mt[(kk + M) % N] ^ (y >> 1) ^ (MATRIX_A if y & 1 else 0)
            self.mti = 0
        y = mt[self.mti]
        self.mti += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        y ^= y >> 18
        return y

    def double(self):
        while True:
            r = self.int() * DOUBLE_TRANSFORM
            r = (r + self.int()) * DOUBLE_TRANSFORM
            if r < 1.0:
                return r

    def int_range(self, begin, end):
        dist = (end - begin) & 0xFFFFFFFF
        if dist == 0:
            return begin
        if dist <= 0x80000000:
            leftover = (0x80000000 % dist) * 2
            if leftover >= dist:
                leftover -= dist
            maxvalue = 0xFFFFFFFF - leftover
        else:
            maxvalue = dist - 1
        while True:
            r = self.int()
            if r <= maxvalue:
                return begin + r % dist
