// Byte-granular memset: bytes [start, end) of the bound window become the byte whose copies
// fill `pattern`. Each invocation owns whole 32-bit words, so the partial words at either end
// are read-modify-written without races (wgpu copies and clears work on 4-byte units only).
struct Params {
    start: u32,
    end: u32,
    pattern: u32,
    pad: u32,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> dst: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let w0 = p.start / 4u;
    let w1 = (p.end + 3u) / 4u;
    let w = w0 + gid.x + gid.y * nwg.x * 256u;
    if (w < w1) {
        let lo = max(p.start, w * 4u);
        let hi = min(p.end, w * 4u + 4u);
        if (hi - lo == 4u) {
            dst[w] = p.pattern;
        } else {
            var mask = 0u;
            for (var b = lo; b < hi; b++) {
                mask |= 0xffu << ((b - w * 4u) * 8u);
            }
            dst[w] = (dst[w] & ~mask) | (p.pattern & mask);
        }
    }
}
