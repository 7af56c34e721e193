// Byte-granular copy between two different buffers: n bytes from byte `src_start` of the src
// window to byte `dst_start` of the dst window, any alignment of either. Each invocation owns
// one destination word and assembles it from source bytes; partial words at the ends are
// read-modify-written. When both sides share their alignment, whole words move directly.
struct Params {
    dst_start: u32,
    src_start: u32,
    n: u32,
    pad: u32,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> dst: array<u32>;
@group(0) @binding(1) var<storage, read> src: array<u32>;

fn src_byte(i: u32) -> u32 {
    return (src[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu;
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let end = p.dst_start + p.n;
    let w0 = p.dst_start / 4u;
    let w1 = (end + 3u) / 4u;
    let same_phase = (p.dst_start & 3u) == (p.src_start & 3u);
    let w = w0 + gid.x + gid.y * nwg.x * 256u;
    if (w < w1) {
        let lo = max(p.dst_start, w * 4u);
        let hi = min(end, w * 4u + 4u);
        if (hi - lo == 4u && same_phase) {
            dst[w] = src[(p.src_start + lo - p.dst_start) >> 2u];
        } else {
            var val = 0u;
            var mask = 0u;
            for (var b = lo; b < hi; b++) {
                let shift = (b - w * 4u) * 8u;
                val |= src_byte(p.src_start + (b - p.dst_start)) << shift;
                mask |= 0xffu << shift;
            }
            if (mask == 0xffffffffu) {
                dst[w] = val;
            } else {
                dst[w] = (dst[w] & ~mask) | val;
            }
        }
    }
}
