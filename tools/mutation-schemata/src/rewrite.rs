//! The rewrite of one source file: every mutation found at its position becomes a branch
//! on the switch `crate::__mutant_on(id)`, and the file is printed again.

use std::collections::{BTreeMap, BTreeSet};

use syn::spanned::Spanned;
use syn::visit_mut::{self, VisitMut};
use syn::{Arm, BinOp, Block, Expr, ExprBinary, ExprBlock, ExprIf, ExprParen, ImplItemFn, ItemFn, Stmt, TraitItemFn, UnOp};

/// A position in the file: line from 1, column from 0 (proc-macro2's convention).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Pos {
    pub line: usize,
    pub column: usize,
}

impl Pos {
    fn of(span: proc_macro2::Span) -> Pos {
        let start = span.start();
        Pos { line: start.line, column: start.column }
    }
}

/// One mutant, by where cargo-mutants put it: the first token of the function's body, the
/// operator, the arm's pattern or the guard.
#[derive(Clone, Debug)]
pub enum Mutation {
    Value { id: u32, at: Pos, value: String },
    Binary { id: u32, at: Pos, op: String },
    Unary { id: u32, at: Pos },
    Arm { id: u32, at: Pos },
    Guard { id: u32, at: Pos, value: String },
}

impl Mutation {
    pub fn id(&self) -> u32 {
        match self {
            Mutation::Value { id, .. }
            | Mutation::Binary { id, .. }
            | Mutation::Unary { id, .. }
            | Mutation::Arm { id, .. }
            | Mutation::Guard { id, .. } => *id,
        }
    }
}

/// The file with `mutations` written in, and the ids of those placed (found at their
/// position, their replacement parsed).
pub fn rewrite(text: &str, mutations: &[Mutation]) -> syn::Result<(String, BTreeSet<u32>)> {
    let mut file = syn::parse_file(text)?;
    let mut r = Rewriter::default();
    for m in mutations {
        match m {
            Mutation::Value { id, at, value } => {
                if let Ok(value) = syn::parse_str::<Expr>(value) {
                    r.values.entry(*at).or_default().push((*id, value));
                }
            }
            Mutation::Binary { id, at, op } => {
                if let Ok(op) = syn::parse_str::<BinOp>(op) {
                    r.binary.entry(*at).or_default().push((*id, op));
                }
            }
            Mutation::Unary { id, at } => r.unary.entry(*at).or_default().push(*id),
            Mutation::Arm { id, at } => r.arms.entry(*at).or_default().push(*id),
            Mutation::Guard { id, at, value } => {
                if let Ok(value) = syn::parse_str::<Expr>(value) {
                    r.guards.entry(*at).or_default().push((*id, value));
                }
            }
        }
    }
    r.visit_file_mut(&mut file);
    Ok((prettyplease::unparse(&file), r.done))
}

#[derive(Default)]
struct Rewriter {
    values: BTreeMap<Pos, Vec<(u32, Expr)>>,
    binary: BTreeMap<Pos, Vec<(u32, BinOp)>>,
    unary: BTreeMap<Pos, Vec<u32>>,
    arms: BTreeMap<Pos, Vec<u32>>,
    guards: BTreeMap<Pos, Vec<(u32, Expr)>>,
    done: BTreeSet<u32>,
}

fn on(id: u32) -> Expr {
    syn::parse_str(&format!("crate::__mutant_on({id})")).unwrap_or_else(|_| unreachable!("a fixed call parses"))
}

fn paren(e: Expr) -> Expr {
    Expr::Paren(ExprParen { attrs: Vec::new(), paren_token: Default::default(), expr: Box::new(e) })
}

fn block(e: Expr) -> Block {
    Block { brace_token: Default::default(), stmts: vec![Stmt::Expr(e, None)] }
}

/// `if on(id) { then } else { otherwise }`, parenthesised: it stands where an operand did.
fn branch(id: u32, then: Expr, otherwise: Expr) -> Expr {
    let otherwise = Expr::Block(ExprBlock { attrs: Vec::new(), label: None, block: block(otherwise) });
    paren(Expr::If(ExprIf {
        attrs: Vec::new(),
        if_token: Default::default(),
        cond: Box::new(on(id)),
        then_branch: block(then),
        else_branch: Some((Default::default(), Box::new(otherwise))),
    }))
}

impl Rewriter {
    fn body(&mut self, block: &mut Block, at: Option<Pos>) {
        let Some(values) = at.and_then(|at| self.values.remove(&at)) else { return };
        let mut early = Vec::new();
        for (id, value) in values {
            let switch = on(id);
            let stmt: Stmt = syn::parse_quote! { if #switch { return #value; } };
            early.push(stmt);
            self.done.insert(id);
        }
        block.stmts.splice(0..0, early);
    }
}

fn first_stmt(block: &Block) -> Option<Pos> {
    block.stmts.first().map(|s| Pos::of(s.span()))
}

impl VisitMut for Rewriter {
    fn visit_item_fn_mut(&mut self, f: &mut ItemFn) {
        let at = first_stmt(&f.block);
        visit_mut::visit_item_fn_mut(self, f);
        self.body(&mut f.block, at);
    }

    fn visit_impl_item_fn_mut(&mut self, f: &mut ImplItemFn) {
        let at = first_stmt(&f.block);
        visit_mut::visit_impl_item_fn_mut(self, f);
        self.body(&mut f.block, at);
    }

    fn visit_trait_item_fn_mut(&mut self, f: &mut TraitItemFn) {
        let at = f.default.as_ref().and_then(first_stmt);
        visit_mut::visit_trait_item_fn_mut(self, f);
        if let Some(block) = &mut f.default {
            self.body(block, at);
        }
    }

    fn visit_arm_mut(&mut self, arm: &mut Arm) {
        let at = Pos::of(arm.pat.span());
        let guard_at = arm.guard.as_ref().map(|(_, g)| Pos::of(g.span()));
        visit_mut::visit_arm_mut(self, arm);
        if let Some(replacements) = guard_at.and_then(|at| self.guards.remove(&at)) {
            if let Some((_, guard)) = &mut arm.guard {
                for (id, value) in replacements {
                    let original = std::mem::replace(&mut **guard, Expr::Verbatim(Default::default()));
                    **guard = branch(id, value, paren(original));
                    self.done.insert(id);
                }
            }
        }
        if let Some(ids) = self.arms.remove(&at) {
            for id in ids {
                let switch = on(id);
                let off: Expr = syn::parse_quote! { !#switch };
                let guard = match arm.guard.take() {
                    Some((if_token, g)) => (
                        if_token,
                        Box::new(Expr::Binary(ExprBinary {
                            attrs: Vec::new(),
                            left: Box::new(off),
                            op: BinOp::And(Default::default()),
                            right: Box::new(paren(*g)),
                        })),
                    ),
                    None => (Default::default(), Box::new(off)),
                };
                arm.guard = Some(guard);
                self.done.insert(id);
            }
        }
    }

    fn visit_expr_mut(&mut self, e: &mut Expr) {
        visit_mut::visit_expr_mut(self, e);
        match e {
            Expr::Binary(b) => {
                let Some(ops) = self.binary.remove(&Pos::of(b.op.span())) else { return };
                let original = Expr::Binary(b.clone());
                let mut out = original.clone();
                for (id, op) in ops.into_iter().rev() {
                    let mutated = Expr::Binary(ExprBinary {
                        attrs: b.attrs.clone(),
                        left: Box::new(paren((*b.left).clone())),
                        op,
                        right: Box::new(paren((*b.right).clone())),
                    });
                    out = branch(id, mutated, out);
                    self.done.insert(id);
                }
                *e = out;
            }
            Expr::Unary(u) if matches!(u.op, UnOp::Not(_) | UnOp::Neg(_)) => {
                let Some(ids) = self.unary.remove(&Pos::of(u.op.span())) else { return };
                let original = Expr::Unary(u.clone());
                let mut out = original;
                for id in ids {
                    out = branch(id, paren((*u.expr).clone()), out);
                    self.done.insert(id);
                }
                *e = out;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: &str = "
pub fn f(a: u64, b: u64) -> u64 {
    let c = a + b;
    if !(c > 3) { c } else { 0 }
}

pub fn g(x: Option<u64>) -> u64 {
    match x {
        Some(v) if v > 1 => v,
        Some(v) => v + 10,
        None => 0,
    }
}
";

    fn at(line: usize, column: usize) -> Pos {
        Pos { line, column }
    }

    fn placed(mutations: &[Mutation]) -> (String, BTreeSet<u32>) {
        let (text, done) = rewrite(SRC, mutations).unwrap();
        syn::parse_file(&text).unwrap();
        (text, done)
    }

    #[test]
    fn a_value_returns_ahead_of_the_body() {
        let (text, done) = placed(&[Mutation::Value { id: 7, at: at(3, 4), value: "0".into() }]);
        assert_eq!(done, BTreeSet::from([7]));
        let compact: String = text.split_whitespace().collect();
        assert!(compact.contains("->u64{ifcrate::__mutant_on(7){return0;}letc=a+b;"), "{text}");
    }

    #[test]
    fn operators_branch_on_the_switch_and_keep_the_original_otherwise() {
        let (text, done) = placed(&[
            Mutation::Binary { id: 1, at: at(3, 14), op: "-".into() },
            Mutation::Binary { id: 2, at: at(3, 14), op: "*".into() },
            Mutation::Unary { id: 3, at: at(4, 7) },
        ]);
        assert_eq!(done, BTreeSet::from([1, 2, 3]));
        let compact: String = text.split_whitespace().collect();
        assert!(
            compact.contains("(ifcrate::__mutant_on(1){(a)-(b)}else{(ifcrate::__mutant_on(2){(a)*(b)}else{a+b})})"),
            "{text}"
        );
        assert!(compact.contains("(ifcrate::__mutant_on(3){((c>3))}else{!(c>3)})"), "{text}");
    }

    #[test]
    fn arms_and_guards_are_switched_off_by_their_guard() {
        let (text, done) = placed(&[
            Mutation::Guard { id: 4, at: at(9, 19), value: "true".into() },
            Mutation::Arm { id: 5, at: at(9, 8) },
            Mutation::Arm { id: 6, at: at(10, 8) },
        ]);
        assert_eq!(done, BTreeSet::from([4, 5, 6]));
        let compact: String = text.split_whitespace().collect();
        assert!(
            compact.contains("if!crate::__mutant_on(5)&&((ifcrate::__mutant_on(4){true}else{(v>1)}))=>v"),
            "{text}"
        );
        assert!(compact.contains("Some(v)if!crate::__mutant_on(6)=>v+10"), "{text}");
    }

    #[test]
    fn a_mutant_not_found_at_its_position_is_not_placed() {
        let (_, done) = placed(&[
            Mutation::Binary { id: 8, at: at(3, 13), op: "-".into() },
            Mutation::Value { id: 9, at: at(3, 4), value: "not an expression (".into() },
        ]);
        assert!(done.is_empty());
    }
}
