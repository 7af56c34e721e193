#!/usr/bin/env python3
"""A lock-step emulation of CUDA's `op_matmul_mma` (vendors/cuda/kernels/matmul.cu), for
checking its index arithmetic without a GPU: each function here is a line-by-line transcription
of the kernel's (the per-thread copies with their byte counts at the edges, the XOR-swizzled
shared offsets, the ldmatrix lane addresses, the three stages in flight and which one is
refilled, the tile order, the stores), while ldmatrix (plain and transposing) and
mma.m16n8k16 are modelled from the PTX documentation's fragment layouts — the same layouts
common.cuh's helpers, checked on GPUs by the flash-attention kernel, rely on.

It runs the products of the `matmul::*::tensor_core_tiles` conformance case and a few more on
small integers (exact in f16 and f32) and compares with NumPy exactly; it also fails on a read
of shared memory whose copy is still in flight, a copy into the stage being multiplied, a
misaligned ldmatrix row or cp.async destination, and a tile order that misses a tile. Run it
by hand after changing the kernel (it is not a substitute for the GPU run of `ci/gpu.sh`,
which runs the matmul conformance with cuBLAS off):

    python3 ci/emulate_matmul_mma.py        (needs NumPy; about 10 s)
"""
import sys
import numpy as np
BM=BN=128; BK=32; THREADS=128
A_HALVES=BM*BK; STAGE_HALVES=A_HALVES+BK*BN

def k_rows_at(r,ch): return (r*BK + ((ch ^ ((r>>1)&3))<<3))*2
def n_rows_at(r,ch): return (r*BN + ((ch ^ (r&7))<<3))*2

class P:
    """struct Mm: sizes and strides (elements), alpha, beta."""

class Copies:
    """MmaCopies<B_ROWS>: one thread's 4 + 4 chunks of a stage; `issue` appends (tile, shared byte
    address, source element index, bytes read) per cp.async."""
    def __init__(s, B_ROWS, A, B, p, row0, col0, tid):
        s.B_ROWS=B_ROWS; s.a=[0]*4; s.b=[0]*4; s.sa=[0]*4; s.sb=[0]*4; s.in_a=0; s.in_b=0; s.ka=[0]*4; s.kb=[0]*4; s.tid=tid
        for i in range(4):
            q=tid+i*THREADS; r=q>>2; ch=q&3; gr=row0+r
            s.in_a |= (1 if gr<p.m else 0)<<i
            s.a[i]=A+(gr if gr<p.m else 0)*p.a_sm+ch*8
            s.ka[i]=ch*8; s.sa[i]=k_rows_at(r,ch)
            if B_ROWS:
                kr=q>>4; nch=q&15; gc=col0+nch*8
                s.in_b |= (1 if gc<p.n else 0)<<i
                s.kb[i]=kr; s.b[i]=B+kr*p.b_sk+(gc if gc<p.n else 0); s.sb[i]=n_rows_at(kr,nch)
            else:
                gc=col0+r
                s.in_b |= (1 if gc<p.n else 0)<<i
                s.kb[i]=ch*8; s.b[i]=B+(gc if gc<p.n else 0)*p.b_sn+ch*8; s.sb[i]=k_rows_at(r,ch)
    def issue(s, stage, p, col0, k0, out):
        for i in range(4):
            gk=k0+s.ka[i]
            nb = min(8,p.k-gk)*2 if ((s.in_a>>i)&1) and gk<p.k else 0
            out.append(('A', stage+s.sa[i], (s.a[i]+k0) if nb else s.a[0], nb))
        sb0=stage+A_HALVES*2
        for i in range(4):
            gk=k0+s.kb[i]
            if s.B_ROWS:
                gc=col0+(((s.tid+i*THREADS)&15)*8)
                nb = min(8,p.n-gc)*2 if ((s.in_b>>i)&1) and gk<p.k else 0
            else:
                nb = min(8,p.k-gk)*2 if ((s.in_b>>i)&1) and gk<p.k else 0
            out.append(('B', sb0+s.sb[i], (s.b[i]+(k0*p.b_sk if s.B_ROWS else k0)) if nb else s.b[0], nb))

def ldmatrix(smem, addrs, trans, pending):
    """ldmatrix.x4 (.trans): lanes 8j..8j+7 address matrix j's rows; lane 4g+t receives row g,
    columns 2t, 2t+1 of each matrix (the transpose's, with .trans)."""
    # addrs: 32 byte addresses; returns regs[32][4] as pairs of values
    for a in addrs:
        for h in range(8):
            assert (a//2+h) not in pending, "read of a half still in flight"
        assert a % 16 == 0
    M=[[smem[addrs[8*j+i]//2 + c] for c in range(8)] for j in range(4) for i in range(8)]
    M=[M[8*j:8*j+8] for j in range(4)]
    regs=[]
    for l in range(32):
        g=l>>2; t=l&3
        if trans: regs.append([(M[j][2*t][g], M[j][2*t+1][g]) for j in range(4)])
        else: regs.append([(M[j][g][2*t], M[j][g][2*t+1]) for j in range(4)])
    return regs

def mma(acc, af, bf):
    """mma.sync.m16n8k16.row.col with f32 accumulators, from the 32 lanes' fragments."""
    # acc[l] = 4 floats; af[l] = 4 pairs; bf[l] = 2 pairs
    Am=np.zeros((16,16)); Bm=np.zeros((16,8))
    for l in range(32):
        g=l>>2; t=l&3
        Am[g][2*t],Am[g][2*t+1]=af[l][0]; Am[g+8][2*t],Am[g+8][2*t+1]=af[l][1]
        Am[g][2*t+8],Am[g][2*t+9]=af[l][2]; Am[g+8][2*t+8],Am[g+8][2*t+9]=af[l][3]
        Bm[2*t][g],Bm[2*t+1][g]=bf[l][0]; Bm[2*t+8][g],Bm[2*t+9][g]=bf[l][1]
    D=Am@Bm
    for l in range(32):
        g=l>>2; t=l&3
        acc[l][0]+=D[g][2*t]; acc[l][1]+=D[g][2*t+1]; acc[l][2]+=D[g+8][2*t]; acc[l][3]+=D[g+8][2*t+1]

def run_block(mem, A, B, C, p, row0, col0, B_ROWS):
    """mma_tile<B_ROWS> for one block: cp.async groups complete only when waited on."""
    smem=np.full(3*STAGE_HALVES, np.nan)
    cps=[Copies(B_ROWS,A,B,p,row0,col0,tid) for tid in range(THREADS)]
    groups=[]  # list of lists of copies
    pending=set()
    def issue_all(stage,k0):
        g=[]
        for c in cps: c.issue(stage,p,col0,k0,g)
        for (_,dst,src,nb) in g:
            assert dst%16==0
            for h in range(8): pending.add(dst//2+h)
        return g
    def commit(g): groups.append(g)
    def wait(n):
        while len(groups)>n:
            g=groups.pop(0)
            for (_,dst,src,nb) in g:
                for h in range(8):
                    smem[dst//2+h] = mem[src+h] if h < nb//2 else 0.0
                    pending.discard(dst//2+h)
    # per-warp, per-lane ldmatrix offsets
    warps=[]
    for w in range(4):
        wm=w>>1; wn=w&1
        la=[[0]*2 for _ in range(32)]; lb=[[[0]*4 for _ in range(2)] for _ in range(32)]
        for l in range(32):
            for ks in range(2):
                la[l][ks]=k_rows_at(wm*64+(l&15), ks*2+(l>>4))
                for pj in range(4):
                    lb[l][ks][pj]= n_rows_at(ks*16+(l&15), wn*8+pj*2+(l>>4)) if B_ROWS else k_rows_at(wn*64+pj*16+(l&7)+((l>>4)<<3), ks*2+((l>>3)&1))
        acc=[[[ [0.0]*4 for _ in range(32)] for nj in range(8)] for mi in range(4)]
        warps.append((wm,wn,la,lb,acc))
    stage=STAGE_HALVES*2
    tiles=(p.k+BK-1)//BK
    commit(issue_all(0,0))
    commit(issue_all(stage,BK) if tiles>1 else [])
    s=0
    for t in range(tiles):
        wait(1)
        fill = 2 if s==0 else s-1
        if t+2<tiles:
            g=issue_all(fill*stage,(t+2)*BK)
            # a copy into the stage being read now would race
            for (_,dst,_,_) in g: assert not (s*stage <= dst < (s+1)*stage)
        else: g=[]
        commit(g)
        for (wm,wn,la,lb,acc) in warps:
            base=s*stage; sb=base+A_HALVES*2
            for ks in range(2):
                af=[ldmatrix(smem,[base+la[l][ks]+mi*16*BK*2 for l in range(32)],False,pending) for mi in range(4)]
                bf=[None]*8
                for pj in range(4):
                    tt=ldmatrix(smem,[sb+lb[l][ks][pj] for l in range(32)],B_ROWS,pending)
                    bf[2*pj]=[[tt[l][0],tt[l][1]] for l in range(32)]
                    bf[2*pj+1]=[[tt[l][2],tt[l][3]] for l in range(32)]
                for mi in range(4):
                    for nj in range(8):
                        mma(acc[mi][nj], af[mi], bf[nj])
        s = 0 if s==2 else s+1
    wait(0)
    pairs = p.c_sn==1 and p.beta==0.0 and p.c_sm%2==0
    for (wm,wn,la,lb,acc) in warps:
        for l in range(32):
            g=l>>2; tq=l&3
            for mi in range(4):
                for nj in range(8):
                    for h in range(2):
                        r=row0+wm*64+mi*16+g+8*h; col=col0+wn*64+nj*8+2*tq
                        v0=acc[mi][nj][l][2*h]; v1=acc[mi][nj][l][2*h+1]
                        for (cc,v) in ((col,v0),(col+1,v1)):
                            if r>=p.m or cc>=p.n: continue
                            i=C+r*p.c_sm+cc*p.c_sn
                            out=p.alpha*v
                            if p.beta!=0.0: out+=p.beta*mem[i]
                            mem[i]=out

def check(m,n,k,b_rows,a_pad=0,alpha=1.0,beta=0.0,seed=0):
    """op_matmul_mma's grid over one product, against NumPy, exactly."""
    rng=np.random.default_rng(seed)
    a_sm=k+a_pad
    A=rng.integers(-3,4,size=(m,a_sm)).astype(float)
    Bm=rng.integers(-3,4,size=(k,n)).astype(float)
    C0=rng.integers(-3,4,size=(m,n)).astype(float)
    mem=[]
    Aoff=0; mem+=list(A.ravel())
    Boff=len(mem)
    p=P(); p.m,p.n,p.k=m,n,k; p.a_sm=a_sm; p.a_sk=1; p.alpha=alpha; p.beta=beta
    if b_rows: mem+=list(Bm.ravel()); p.b_sk=n; p.b_sn=1
    else: mem+=list(Bm.T.ravel()); p.b_sk=1; p.b_sn=k
    Coff=len(mem); mem+=list(C0.ravel()); p.c_sm=n; p.c_sn=1
    mem+= [7.0]*64  # past the end
    mem=np.array(mem)
    gx=(n+127)//128; gy=(m+127)//128
    seen=set()
    for by_ in range(gy):
        for bx_ in range(gx):
            pid=by_*gx+bx_
            first=pid//(8*gx)*8; ig=pid%(8*gx); rows=min(gy-first,8)
            r0=(first+ig%rows)*BM; c0=ig//rows*BN
            seen.add((r0,c0))
            run_block(mem,Aoff,Boff,Coff,p,r0,c0,b_rows)
    assert len(seen)==gx*gy, "tile mapping not a bijection"
    got=mem[Coff:Coff+m*n].reshape(m,n)
    want=alpha*(A[:, :k]@Bm)+beta*C0
    ok=np.array_equal(got,want)
    print(f"m={m} n={n} k={k} b_rows={b_rows} pad={a_pad} alpha={alpha} beta={beta}: {'ok' if ok else 'MISMATCH'}")
    if not ok:
        bad=np.argwhere(got!=want); print(bad[:10]); sys.exit(1)

if __name__ == "__main__":
  for args in [ (130,136,264,True), (130,136,264,False), (1,8,8,True),(129,200,72,False),(140,144,20,True,4),(136,136,32,True,0,0.5,-1.5),(64,64,64,False),(3,8,0,True,0,1.0,2.0),(260,130,40,False)]:
    check(*args)
