// add_f32(a: *f32, b: *f32, out: *f32, n: u32): out[i] = a[i] + b[i]; out may alias a or b.
// Every binding is read_write so that aliasing arguments (one buffer bound several times) are
// one compatible usage; each element is read before it is written by the same invocation.
struct Params {
    a_off: u32,
    b_off: u32,
    out_off: u32,
    n: u32,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    // 2-D grid when one dimension's workgroup limit is too small; row length nwg.x * 256.
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i < p.n) {
        out[p.out_off + i] = a[p.a_off + i] + b[p.b_off + i];
    }
}
