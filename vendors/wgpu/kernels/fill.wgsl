// fill(dst: *u32, value: u32, n: u32): dst[i] = value for i < n.
// `off` is dst's element offset inside the bound window (interior pointers, bindings aligned
// down to min_storage_buffer_offset_alignment). A 2-D grid, so any n fits the per-dimension dispatch limit.
struct Params {
    off: u32,
    value: u32,
    n: u32,
    pad: u32,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> dst: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    // 2-D grid when one dimension's workgroup limit is too small; row length nwg.x * 256.
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i < p.n) {
        dst[p.off + i] = p.value;
    }
}
