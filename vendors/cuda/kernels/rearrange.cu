// The rearrange op family: a strided copy (rearrange / contiguous / copy_into) and concat
// (one launch per input, into its slice of the output). Elements are copied bit for bit, so
// one kernel serves every dtype of the same size.

struct Map {
    Space s;
    Strides so, si;
};

extern "C" __global__ void op_rearrange(T *out, const T *in, Map m)
{
    GRID_LOOP(i, m.s.n)
    {
        i64 oo, oi;
        offsets_of2(m.s, m.so, m.si, i, &oo, &oi);
        out[oo] = in[oi];
    }
}

// One input of a concat: `out` already points at the input's slice of the output.
extern "C" __global__ void op_concat(T *out, const T *in, Map m)
{
    GRID_LOOP(i, m.s.n)
    {
        i64 oo, oi;
        offsets_of2(m.s, m.so, m.si, i, &oo, &oi);
        out[oo] = in[oi];
    }
}
