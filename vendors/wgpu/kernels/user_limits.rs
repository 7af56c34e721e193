//! How deep a user's WGSL may nest, checked before any compiler sees it.
//!
//! naga's WGSL front end lowers an expression by recursing down its syntax tree, and a chain
//! of binary operators is a tree as deep as the chain is long: `v + 1.0 + 1.0 + …` with
//! 20 000 terms overflowed the 8 MiB stack of the thread that planned the kernel (inside
//! unirt's own check and, without it, inside wgpu's `create_shader_module`), and Rust aborts
//! on a stack overflow. Further down, drivers' compilers recurse along chains of dependent
//! operations: a kernel of 100 000 `let`s each using the one before (200 000 dependent
//! operations) crashed lavapipe's LLVM in its own compile thread; 20 000 (40 000 operations)
//! compiled, in 16 s. So a user kernel must pass two bounds:
//!
//! - [`nesting_estimate`] of its source (no parse needed) at most [`MAX_NESTING`]; and
//! - [`dependency_depth`] of the parsed module at most [`MAX_DEPENDENCY_DEPTH`].
//!
//! Both are far above what a kernel written by hand or by a code generator uses (unirt's
//! own largest generated kernels stay in the tens). Every parse of a user kernel — unirt's
//! check and wgpu's compile — runs on a thread with [`PARSE_STACK`] bytes of stack, whatever
//! the caller's: 8000 levels take about 5 MB there with naga optimised (about 600 bytes a
//! level) and stay under it at ten times that unoptimised.

use naga::{Expression, Handle};

/// The deepest expression a user kernel may write ([`nesting_estimate`]).
pub(super) const MAX_NESTING: usize = 8000;

/// The longest chain of dependent operations a user kernel may compute ([`dependency_depth`]).
pub(super) const MAX_DEPENDENCY_DEPTH: usize = 10_000;

/// Stack of the thread that parses a user kernel to check it.
pub(super) const PARSE_STACK: usize = 64 << 20;

/// An upper estimate of how deep naga's front end recurses to lower the deepest expression of
/// `src`: within a statement, the operator characters of one comma-separated operand, plus the
/// deepest bracketed group in it, one more per group level. A long operand list (an array of
/// negative literals) costs its longest element, not its length. Comments are skipped.
pub(super) fn nesting_estimate(src: &str) -> usize {
    #[derive(Default, Clone, Copy)]
    struct Level {
        ops: usize,
        child: usize,
        best: usize,
    }
    impl Level {
        fn end_operand(&mut self) {
            self.best = self.best.max(self.ops + self.child);
            self.ops = 0;
            self.child = 0;
        }
    }
    let mut levels = vec![Level::default()];
    let mut deepest = 0;
    let b = src.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                // WGSL block comments nest.
                let mut open = 0usize;
                while i < b.len() {
                    if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                        open += 1;
                        i += 1;
                    } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                        open -= 1;
                        i += 1;
                        if open == 0 {
                            break;
                        }
                    }
                    i += 1;
                }
            }
            b'(' | b'[' => levels.push(Level::default()),
            b')' | b']' if levels.len() > 1 => {
                let mut inner = levels.pop().unwrap_or_default();
                inner.end_operand();
                if let Some(outer) = levels.last_mut() {
                    outer.child = outer.child.max(inner.best + 1);
                }
            }
            b',' => {
                if let Some(l) = levels.last_mut() {
                    l.end_operand();
                }
            }
            b';' | b'{' | b'}' => {
                // A statement ends: whatever is open ends with it.
                while let Some(mut l) = levels.pop() {
                    l.end_operand();
                    deepest = deepest.max(l.best + levels.len());
                }
                levels.push(Level::default());
            }
            b'+' | b'-' | b'*' | b'/' | b'%' | b'&' | b'|' | b'^' | b'<' | b'>' | b'=' | b'!' => {
                if let Some(l) = levels.last_mut() {
                    l.ops += 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    while let Some(mut l) = levels.pop() {
        l.end_operand();
        deepest = deepest.max(l.best + levels.len());
    }
    deepest
}

/// The longest chain of expressions, each an operand of the next, in any function of
/// `module` (values passed through a variable's store and load, or a call, start a new chain).
pub(super) fn dependency_depth(module: &naga::Module) -> usize {
    let functions = module
        .functions
        .iter()
        .map(|(_, f)| f)
        .chain(module.entry_points.iter().map(|e| &e.function));
    let mut deepest = 0;
    for f in functions {
        let mut depth = vec![0usize; f.expressions.len()];
        for (h, e) in f.expressions.iter() {
            let mut d = 0;
            for_each_operand(e, |o| d = d.max(depth.get(o.index()).copied().unwrap_or(0)));
            depth[h.index()] = d + 1;
            deepest = deepest.max(d + 1);
        }
    }
    deepest
}

/// Calls `f` with each expression `e` reads (the arithmetic and access forms; the others
/// read none that matter here).
fn for_each_operand(e: &Expression, mut f: impl FnMut(Handle<Expression>)) {
    match e {
        Expression::Compose { components, .. } => components.iter().copied().for_each(f),
        Expression::Access { base, index } => {
            f(*base);
            f(*index);
        }
        Expression::AccessIndex { base, .. } => f(*base),
        Expression::Splat { value, .. } => f(*value),
        Expression::Swizzle { vector, .. } => f(*vector),
        Expression::Load { pointer } => f(*pointer),
        Expression::Unary { expr, .. }
        | Expression::Derivative { expr, .. }
        | Expression::As { expr, .. } => f(*expr),
        Expression::Binary { left, right, .. } => {
            f(*left);
            f(*right);
        }
        Expression::Select {
            condition,
            accept,
            reject,
        } => {
            f(*condition);
            f(*accept);
            f(*reject);
        }
        Expression::Relational { argument, .. } => f(*argument),
        Expression::Math {
            arg,
            arg1,
            arg2,
            arg3,
            ..
        } => {
            f(*arg);
            [arg1, arg2, arg3]
                .into_iter()
                .flatten()
                .copied()
                .for_each(f);
        }
        Expression::ArrayLength(e) => f(*e),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nesting_counts_chains_not_lists() {
        let chain = format!("let x = v{};", " + 1.0".repeat(3000));
        assert!(nesting_estimate(&chain) >= 3000);
        let list = format!(
            "const a = array<f32, 3000>({});",
            vec!["-1.5"; 3000].join(", ")
        );
        assert!(nesting_estimate(&list) < 10, "{}", nesting_estimate(&list));
        let nested = format!("let y = {}v{};", "(v + ".repeat(150), ")".repeat(150));
        let n = nesting_estimate(&nested);
        assert!((300..=320).contains(&n), "{n}");
        let commented = format!(
            "// {}\n/* {} /* nested */ */ let z = v;",
            "+".repeat(5000),
            "-".repeat(5000)
        );
        assert!(nesting_estimate(&commented) < 10);
    }

    #[test]
    fn dependency_depth_follows_lets_but_not_variables() {
        let lets: String = (0..500)
            .map(|i| format!("let a{} = a{} * 2.0 + 1.0;\n", i + 1, i))
            .collect();
        let src = format!("fn f(a0: f32) -> f32 {{\n{lets}return a500;\n}}");
        let m = naga::front::wgsl::parse_str(&src).unwrap();
        assert!(dependency_depth(&m) >= 1000, "{}", dependency_depth(&m));
        let vars: String = (0..500).map(|_| "x = x * 2.0 + 1.0;\n").collect();
        let src = format!("fn g(a0: f32) -> f32 {{\nvar x = a0;\n{vars}return x;\n}}");
        let m = naga::front::wgsl::parse_str(&src).unwrap();
        assert!(dependency_depth(&m) < 10, "{}", dependency_depth(&m));
    }
}
