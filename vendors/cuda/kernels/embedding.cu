// The embedding op family: out[i, :] = table[ids[i], :] for i32 or i64 ids
// (`op_embedding_i32`, `op_embedding_i64`). A device kernel cannot return an error: an id
// outside the vocabulary writes a row of zeros and claims the plan's fault word with the id,
// which the stream's next synchronisation reports as IndexOutOfRange (vendors/cuda/fault.rs).

struct Emb {
    Space ids;        // the ids' shape
    Strides sid, so;  // strides of the ids and of the output's rows over it
    i64 vocab, dim, t_st0, t_st1, o_st;
};

// Claims the fault word (the first claim wins and records the offending value).
__device__ __forceinline__ void claim_fault(unsigned *fault, i64 value)
{
    if (atomicExch(fault, 1u) == 0u) {
        fault[1] = (unsigned)(u64)value;
        fault[2] = (unsigned)((u64)value >> 32);
    }
}

template <typename I>
__device__ __forceinline__ void gather_rows(T *out, const I *ids, const T *table, unsigned *fault,
                                            const Emb &p)
{
    i64 total = p.ids.n * p.dim;
    GRID_LOOP(k, total)
    {
        i64 i = k / p.dim, j = k - i * p.dim;
        i64 id = (i64)ids[offset_of(p.ids, p.sid, i)];
        T *y = out + offset_of(p.ids, p.so, i) + j * p.o_st;
        if (id < 0 || id >= p.vocab) {
            *y = from_f32<T>(0.0f);
            if (j == 0) claim_fault(fault, id);
        } else {
            *y = table[id * p.t_st0 + j * p.t_st1];
        }
    }
}

extern "C" __global__ void op_embedding_i32(T *out, const int *ids, const T *table,
                                             unsigned *fault, Emb p)
{
    gather_rows<int>(out, ids, table, fault, p);
}

extern "C" __global__ void op_embedding_i64(T *out, const i64 *ids, const T *table,
                                             unsigned *fault, Emb p)
{
    gather_rows<i64>(out, ids, table, fault, p);
}
