//! The kernel plan: which of the bit-identical implementations runs each format's matmuls.
//!
//! Every quantized format has several implementations of its dot product that give the
//! scalar reference's bits exactly (`tests/simd_twins*.rs`, `tests/multi_token.rs`):
//! one row at a time per tier, four weight rows per activation row (decode), four tokens
//! per weight row, the AVX2 token groups, the AVX-512 VNNI tiles and the AMX tiles
//! (prefill). Which is fastest depends on the CPU (an AVX2 kernel can stream a large
//! matrix faster than an AVX-512 one on one CPU and slower on another), so the choice is
//! data: a [`KernelPlan`] holds one [`FormatPlan`] per weight format, and this module is
//! the one place that decides what is eligible ([`decode_candidates`],
//! [`prefill_candidates`]) and what runs by default ([`KernelPlan::default_rules`]).
//!
//! A plan never changes a result: any choice gives every output the same bits
//! (`tests/plan_bits.rs` checks every candidate of every format). [`crate::tune`] times the
//! eligible candidates on a model's own weights; binaries cache its result. `NX_PLAN`
//! forces choices ([`KernelPlan::apply_spec`]): a comma-separated list of
//! `FORMAT.ROLE=KERNEL` items (`FORMAT` a ggml type name or `*`, `ROLE` `decode` or
//! `prefill`), e.g. `NX_PLAN=q8_0.decode=avx2,q4_k.prefill=avx512-tiles`; a leading
//! `default` item asks for the default rules without timing, a leading `retune` item
//! (for binaries that cache tuned plans) for timing again.
//!
//! ```
//! use nx_lazy_weight::{CpuTier, GgmlType, KernelPlan};
//!
//! let mut plan = KernelPlan::default_rules(CpuTier::Scalar);
//! plan.apply_spec("q8_0.decode=scalar,q8_0.prefill=per-token").unwrap();
//! assert_eq!(plan.get(GgmlType::Q8_0).decode.name(), "scalar");
//! assert_eq!(plan.to_spec(), "q8_0.decode=scalar,q8_0.prefill=per-token");
//! assert!(plan.apply_spec("q8_0.decode=avx7").is_err());
//! ```

use std::fmt;
use std::sync::{Arc, RwLock};

use nx_gguf::GgmlType;
use nx_syscalls::CpuTier;

use crate::dot_scalar;
pub use crate::error::PlanError;
use crate::formats::vec_dot_type;
use crate::tier::active_tier;
use crate::LazyWeightError;

/// The implementation of a one-token matmul (a matrix-vector product).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DecodeKernel {
    /// One weight row at a time with the tier's own kernel.
    Rows1(CpuTier),
    /// Four weight rows per call, each activation block prepared once for the four.
    Rows4(CpuTier),
}

/// The implementation of a matmul with two or more tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PrefillKernel {
    /// Every token through the format's decode kernel.
    PerToken,
    /// Four tokens per call of the tier's four-token kernel, each weight block decoded
    /// once for the four.
    Tokens4(CpuTier),
    /// The AVX2 token groups (every token at once).
    Groups,
    /// The AVX-512 VNNI tiles, sixteen tokens per register (narrow tiles for the 2 to 16
    /// tokens after the whole groups).
    Tiles,
    /// The AMX tiles (Q4_K, Q6_K).
    Amx,
}

/// The kernels of one weight format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FormatPlan {
    /// One token.
    pub decode: DecodeKernel,
    /// Two or more tokens.
    pub prefill: PrefillKernel,
}

/// What a matmul does: one token, or several.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// A matrix-vector product (decoding one sequence).
    Decode,
    /// Two or more tokens (prefill, batched decoding, draft verification).
    Prefill,
}

impl Role {
    /// The name used by `NX_PLAN`.
    pub fn name(self) -> &'static str {
        match self {
            Role::Decode => "decode",
            Role::Prefill => "prefill",
        }
    }
}

impl DecodeKernel {
    /// The name used by `NX_PLAN` and in reports (`avx2`, `avx512-rows4`, …).
    pub fn name(self) -> String {
        match self {
            DecodeKernel::Rows1(t) => t.name().to_string(),
            DecodeKernel::Rows4(t) => format!("{}-rows4", t.name()),
        }
    }

    /// The tier whose kernels run.
    pub fn tier(self) -> CpuTier {
        match self {
            DecodeKernel::Rows1(t) | DecodeKernel::Rows4(t) => t,
        }
    }
}

impl PrefillKernel {
    /// The name used by `NX_PLAN` and in reports (`avx512-tiles`, `amx-tiles`, …).
    pub fn name(self) -> String {
        match self {
            PrefillKernel::PerToken => "per-token".into(),
            PrefillKernel::Tokens4(t) => format!("{}-tokens4", t.name()),
            PrefillKernel::Groups => "avx2-groups".into(),
            PrefillKernel::Tiles => "avx512-tiles".into(),
            PrefillKernel::Amx => "amx-tiles".into(),
        }
    }
}

/// The kernels of every weight format: the formats given explicitly (by [`crate::tune::tune`] or
/// `NX_PLAN`), and the default rules for the rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelPlan {
    tier: CpuTier,
    chosen: Vec<(GgmlType, FormatPlan)>,
    /// The default rules' kernels of every planned format at `tier`, worked out once:
    /// [`KernelPlan::get`] runs on every matmul, and the candidate lists (with their
    /// CPU feature checks) cost allocations there.
    defaults: Vec<(GgmlType, FormatPlan)>,
}

/// True when this process may run kernels of `tier`: the scalar ones always, the active
/// tier's, and AVX2 under AVX-512 (every AVX-512 VNNI CPU has AVX2, FMA and F16C).
fn tier_allowed(active: CpuTier, tier: CpuTier) -> bool {
    tier == CpuTier::Scalar
        || tier == active
        || (active == CpuTier::Avx512Vnni && tier == CpuTier::Avx2)
}

/// True when `tier` has a one-row kernel of its own for `ty`.
fn has_rows1(tier: CpuTier, ty: GgmlType) -> bool {
    match tier {
        CpuTier::Scalar => dot_scalar::dot_kernel(ty).is_some(),
        #[cfg(target_arch = "x86_64")]
        CpuTier::Avx2 => crate::avx2::kernel(ty).is_some(),
        #[cfg(target_arch = "x86_64")]
        CpuTier::Avx512Vnni => crate::avx512::kernel(ty).is_some(),
        #[cfg(target_arch = "aarch64")]
        CpuTier::Neon => crate::neon::kernel(ty).is_some(),
        #[allow(unreachable_patterns)] // tiers of other architectures
        _ => false,
    }
}

/// True when `tier` has a four-row kernel of its own for `ty`.
fn has_rows4(tier: CpuTier, ty: GgmlType) -> bool {
    match tier {
        #[cfg(target_arch = "x86_64")]
        CpuTier::Avx512Vnni => crate::avx512::kernel_rows4(ty).is_some(),
        #[cfg(target_arch = "x86_64")]
        CpuTier::Avx2 => crate::avx2_rows4::kernel_rows4(ty).is_some(),
        _ => false,
    }
}

/// True when `tier` has a four-token kernel of its own for `ty`.
fn has_tokens4(tier: CpuTier, ty: GgmlType) -> bool {
    match tier {
        CpuTier::Scalar => crate::formats::block_format(ty).is_some_and(|f| f.dot4.is_some()),
        #[cfg(target_arch = "x86_64")]
        CpuTier::Avx2 => crate::avx2::kernel4(ty).is_some(),
        #[cfg(target_arch = "x86_64")]
        CpuTier::Avx512Vnni => crate::avx512::kernel4(ty).is_some(),
        _ => false,
    }
}

/// The tiers this process may use, highest first.
fn allowed_tiers(active: CpuTier) -> Vec<CpuTier> {
    [
        CpuTier::Avx512Vnni,
        CpuTier::Avx2,
        CpuTier::Neon,
        CpuTier::Scalar,
    ]
    .into_iter()
    .filter(|&t| tier_allowed(active, t))
    .collect()
}

/// Every decode kernel of `ty` this process can run at `active`, the default first.
pub fn decode_candidates(active: CpuTier, ty: GgmlType) -> Vec<DecodeKernel> {
    let mut out = Vec::new();
    for tier in allowed_tiers(active) {
        if has_rows4(tier, ty) {
            out.push(DecodeKernel::Rows4(tier));
        }
        if has_rows1(tier, ty) {
            out.push(DecodeKernel::Rows1(tier));
        }
    }
    out
}

/// Every prefill kernel of `ty` this process can run at `active`, the default first.
pub fn prefill_candidates(active: CpuTier, ty: GgmlType) -> Vec<PrefillKernel> {
    let mut out = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        let avx512 = tier_allowed(active, CpuTier::Avx512Vnni);
        if avx512 && crate::amx::has_kernel(ty) && crate::amx::available() {
            out.push(PrefillKernel::Amx);
        }
        if avx512 && crate::tiled::has_kernel(ty) && crate::tiled::available() {
            out.push(PrefillKernel::Tiles);
        }
        let avx2 = tier_allowed(active, CpuTier::Avx2);
        // The groups are AVX2's default; under AVX-512 the tiles come first.
        let groups = (crate::groups_avx2::has_kernel(ty) && crate::groups_avx2::available())
            || (crate::kgroups_avx2::has_kernel(ty) && crate::kgroups_avx2::available());
        if avx2 && groups {
            out.push(PrefillKernel::Groups);
        }
    }
    for tier in allowed_tiers(active) {
        // The scalar four-token kernels only where no SIMD tier runs: under one, its
        // kernels are faster (x86) or the choice is unmeasured (Neon's one-row kernels).
        let scalar_under_simd = tier == CpuTier::Scalar && active != CpuTier::Scalar;
        if has_tokens4(tier, ty) && !scalar_under_simd {
            out.push(PrefillKernel::Tokens4(tier));
        }
    }
    out.push(PrefillKernel::PerToken);
    out
}

/// The candidates of `ty` for `role`, by name.
fn candidate_names(active: CpuTier, ty: GgmlType, role: Role) -> Vec<String> {
    match role {
        Role::Decode => decode_candidates(active, ty)
            .into_iter()
            .map(DecodeKernel::name)
            .collect(),
        Role::Prefill => prefill_candidates(active, ty)
            .into_iter()
            .map(PrefillKernel::name)
            .collect(),
    }
}

/// The weight formats that have a dot product (and so a plan).
pub fn planned_formats() -> impl Iterator<Item = GgmlType> {
    GgmlType::ALL
        .iter()
        .copied()
        .filter(|&t| dot_scalar::dot_kernel(t).is_some())
}

/// The default rules' kernels of `ty` at `tier`: the first candidate of each role.
fn default_kernels(tier: CpuTier, ty: GgmlType) -> FormatPlan {
    let decode = decode_candidates(tier, ty)
        .first()
        .copied()
        .unwrap_or(DecodeKernel::Rows1(CpuTier::Scalar));
    let prefill = prefill_candidates(tier, ty)
        .first()
        .copied()
        .unwrap_or(PrefillKernel::PerToken);
    FormatPlan { decode, prefill }
}

impl KernelPlan {
    /// The default rules at `tier`: the highest tier's four-row kernel where it has one,
    /// else its one-row kernel; for prefill AMX, then the AVX-512 tiles, then (at the AVX2
    /// tier) the groups, then the four-token kernel.
    pub fn default_rules(tier: CpuTier) -> KernelPlan {
        KernelPlan {
            tier,
            chosen: Vec::new(),
            defaults: planned_formats()
                .map(|ty| (ty, default_kernels(tier, ty)))
                .collect(),
        }
    }

    /// The tier the plan was made for.
    pub fn tier(&self) -> CpuTier {
        self.tier
    }

    /// The kernels of `ty` (the default rules unless chosen).
    pub fn get(&self, ty: GgmlType) -> FormatPlan {
        let mut known = self.chosen.iter().chain(&self.defaults);
        match known.find(|(t, _)| *t == ty) {
            Some((_, p)) => *p,
            None => default_kernels(self.tier, ty),
        }
    }

    /// The formats chosen explicitly, with their kernels.
    pub fn chosen(&self) -> &[(GgmlType, FormatPlan)] {
        &self.chosen
    }

    /// Sets the kernels of `ty`. Errors when this process cannot run them.
    pub fn set(&mut self, ty: GgmlType, plan: FormatPlan) -> Result<(), PlanError> {
        let not_eligible = |role: Role, kernel: String| PlanError::NotEligible {
            format: ty,
            role: role.name(),
            kernel,
            eligible: candidate_names(self.tier, ty, role).join(", "),
        };
        if !decode_candidates(self.tier, ty).contains(&plan.decode) {
            return Err(not_eligible(Role::Decode, plan.decode.name()));
        }
        if !prefill_candidates(self.tier, ty).contains(&plan.prefill) {
            return Err(not_eligible(Role::Prefill, plan.prefill.name()));
        }
        match self.chosen.iter_mut().find(|(t, _)| *t == ty) {
            Some((_, p)) => *p = plan,
            None => self.chosen.push((ty, plan)),
        }
        Ok(())
    }

    /// True when activations of `act_type` should be laid out for `prefill` (some format
    /// multiplied with them takes it).
    ///
    /// Once formats are chosen (the models opened), only theirs count: the default of a
    /// format no model has must not cost every matmul a second layout (where AMX takes
    /// Q4_K and Q6_K, the other Q8_K formats default to the VNNI tiles).
    pub(crate) fn wants(&self, act_type: GgmlType, prefill: PrefillKernel) -> bool {
        let takes =
            |t: GgmlType, p: FormatPlan| vec_dot_type(t) == Some(act_type) && p.prefill == prefill;
        match self.chosen.is_empty() {
            true => planned_formats().any(|t| takes(t, self.get(t))),
            false => self.chosen.iter().any(|&(t, p)| takes(t, p)),
        }
    }

    /// Applies an `NX_PLAN` spec (see the module docs) on top of this plan. A leading
    /// `default` item first drops every choice. Returns whether the spec asked for the
    /// default rules (callers then skip [`crate::tune::tune`]).
    pub fn apply_spec(&mut self, spec: &str) -> Result<bool, PlanError> {
        let mut defaults = false;
        for (i, item) in spec.split(',').map(str::trim).enumerate() {
            if item.is_empty() {
                continue;
            }
            if item.eq_ignore_ascii_case("default") && i == 0 {
                self.chosen.clear();
                defaults = true;
                continue;
            }
            // For binaries that cache tuned plans: time again (nothing to do here).
            if item.eq_ignore_ascii_case("retune") && i == 0 {
                continue;
            }
            self.apply_item(item)?;
        }
        Ok(defaults)
    }

    fn apply_item(&mut self, item: &str) -> Result<(), PlanError> {
        let bad = |reason: &str| PlanError::BadItem {
            item: item.to_string(),
            reason: reason.to_string(),
        };
        let (lhs, kernel) = item
            .split_once('=')
            .ok_or_else(|| bad("expected FORMAT.ROLE=KERNEL"))?;
        let (format, role) = lhs
            .split_once('.')
            .ok_or_else(|| bad("expected FORMAT.ROLE before `=`"))?;
        let role = match role.trim() {
            r if r.eq_ignore_ascii_case("decode") => Role::Decode,
            r if r.eq_ignore_ascii_case("prefill") => Role::Prefill,
            _ => return Err(bad("the role is `decode` or `prefill`")),
        };
        let kernel = kernel.trim().to_ascii_lowercase();
        let formats: Vec<GgmlType> = if format.trim() == "*" {
            planned_formats().collect()
        } else {
            let ty = planned_formats()
                .find(|t| t.name().eq_ignore_ascii_case(format.trim()))
                .ok_or_else(|| bad("unknown weight format (a ggml type name, or `*`)"))?;
            vec![ty]
        };
        let wildcard = formats.len() > 1;
        let mut applied = 0;
        for ty in formats {
            let mut plan = self.get(ty);
            let found = match role {
                Role::Decode => decode_by_name(&kernel).map(|k| plan.decode = k),
                Role::Prefill => prefill_by_name(&kernel).map(|k| plan.prefill = k),
            };
            if found.is_none() {
                return Err(bad(&format!(
                    "unknown {} kernel (known: {})",
                    role.name(),
                    known_names(role).join(", ")
                )));
            }
            match self.set(ty, plan) {
                Ok(()) => applied += 1,
                // `*` applies where the kernel exists and leaves the other formats alone.
                Err(PlanError::NotEligible { .. }) if wildcard => {}
                Err(e) => return Err(e),
            }
        }
        if applied == 0 {
            return Err(bad("no format can run that kernel here"));
        }
        Ok(())
    }

    /// The explicit choices as an `NX_PLAN` spec (round-trips through [`apply_spec`]).
    ///
    /// [`apply_spec`]: KernelPlan::apply_spec
    pub fn to_spec(&self) -> String {
        self.chosen
            .iter()
            .flat_map(|(t, p)| {
                let f = t.name().to_ascii_lowercase();
                [
                    format!("{f}.decode={}", p.decode.name()),
                    format!("{f}.prefill={}", p.prefill.name()),
                ]
            })
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Every kernel name of `role` on any CPU.
fn known_names(role: Role) -> Vec<String> {
    let tiers = [
        CpuTier::Scalar,
        CpuTier::Avx2,
        CpuTier::Avx512Vnni,
        CpuTier::Neon,
    ];
    match role {
        Role::Decode => tiers
            .iter()
            .map(|&t| DecodeKernel::Rows1(t))
            // AVX2 and AVX-512 VNNI have four-row kernels.
            .chain([
                DecodeKernel::Rows4(CpuTier::Avx2),
                DecodeKernel::Rows4(CpuTier::Avx512Vnni),
            ])
            .map(DecodeKernel::name)
            .collect(),
        Role::Prefill => [
            PrefillKernel::PerToken,
            PrefillKernel::Groups,
            PrefillKernel::Tiles,
            PrefillKernel::Amx,
        ]
        .into_iter()
        .chain(tiers.iter().map(|&t| PrefillKernel::Tokens4(t)))
        .map(PrefillKernel::name)
        .collect(),
    }
}

fn decode_by_name(name: &str) -> Option<DecodeKernel> {
    [
        CpuTier::Scalar,
        CpuTier::Avx2,
        CpuTier::Avx512Vnni,
        CpuTier::Neon,
    ]
    .into_iter()
    .flat_map(|t| [DecodeKernel::Rows1(t), DecodeKernel::Rows4(t)])
    .find(|k| k.name() == name)
}

fn prefill_by_name(name: &str) -> Option<PrefillKernel> {
    [
        PrefillKernel::PerToken,
        PrefillKernel::Groups,
        PrefillKernel::Tiles,
        PrefillKernel::Amx,
        PrefillKernel::Tokens4(CpuTier::Scalar),
        PrefillKernel::Tokens4(CpuTier::Avx2),
        PrefillKernel::Tokens4(CpuTier::Avx512Vnni),
        PrefillKernel::Tokens4(CpuTier::Neon),
    ]
    .into_iter()
    .find(|k| k.name() == name)
}

impl fmt::Display for KernelPlan {
    /// One line per explicitly chosen format: `Q8_0  decode=avx2  prefill=avx512-tiles`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (t, p) in &self.chosen {
            writeln!(
                f,
                "{:<8} decode={:<14} prefill={}",
                t.name(),
                p.decode.name(),
                p.prefill.name()
            )?;
        }
        Ok(())
    }
}

/// The plan every matmul of the process uses, once set ([`install`]).
static ACTIVE: RwLock<Option<Arc<KernelPlan>>> = RwLock::new(None);

/// The plan matmuls use: the one [`install`]ed, else the default rules at the
/// [`active_tier`] with `NX_PLAN` applied (an `NX_PLAN` that cannot apply is an error,
/// reported by every matmul as a bad `NX_TIER` is).
pub fn active_plan() -> Result<Arc<KernelPlan>, LazyWeightError> {
    if let Some(p) = ACTIVE.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
        return Ok(Arc::clone(p));
    }
    let mut plan = KernelPlan::default_rules(active_tier()?);
    if let Ok(spec) = std::env::var("NX_PLAN") {
        plan.apply_spec(&spec)?;
    }
    let plan = Arc::new(plan);
    let mut slot = ACTIVE.write().unwrap_or_else(|e| e.into_inner());
    Ok(Arc::clone(slot.get_or_insert(plan)))
}

/// Makes `plan` the process's plan from the next matmul on. Any plan gives the same bits,
/// so this is safe at any time; errors when the plan was made for another tier than the
/// active one or its tile choices conflict.
pub fn install(plan: KernelPlan) -> Result<(), LazyWeightError> {
    let tier = active_tier()?;
    if plan.tier != tier {
        return Err(LazyWeightError::Plan(PlanError::BadItem {
            item: format!("plan for tier {}", plan.tier),
            reason: format!("this process runs tier {tier}"),
        }));
    }
    *ACTIVE.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(plan));
    Ok(())
}

/// The kernels' revision: raised whenever a kernel's speed changes enough that a plan
/// timed before may no longer pick the fastest, so that plans cached by an older build
/// (same version number, same candidates) are timed again. Part of the CLI's plan cache
/// key.
///
/// 2: Q6_K tiles without per-quad corrections, Q4_K / Q5_K tiles pairing groups.
/// 3: the decode prefetch rule (`avx2::prefetch_block`), four-row Q4_K / Q5_K / Q6_K.
/// 4: a chunk's first weight lines prefetched into L2; the narrow tiles' prefetch rule.
/// 5: f16 scales converted without a false dependency; four-row Q4_0 / Q5_0 / Q8_0 /
///    IQ4_NL kernels with their scales in one conversion; AVX2 four-row kernels.
/// 6: IQ4_NL four-row kernel with a block of two rows per register.
/// 7: AVX-512 Q4_K rows with twelve multiplies per super-block.
/// 8: AVX2 token groups for Q4_K and Q6_K.
/// 9: AVX-512 four-row K kernels with their rows written out; the Q4_K four-row kernel's
///    block terms for four rows at once; the tiled Q6_K prefill without a closure call.
/// 10: several rows' prefetch a group's length further when the group is long
///    (`avx2::prefetch_block`); narrow tiles four rows at a time.
/// 11: candidates timed round-robin (plans timed one candidate after another could keep
///    a kernel crowned by a burst of other load).
/// 12: AVX2 Q4_0 / Q5_0 / Q8_0 token groups over weight rows widened once for all the
///    groups, activations group by group.
/// 13: AVX2 Q4_K / Q5_K / Q6_K token groups over widened weight rows.
/// 14: AVX-512 narrow K tiles (2 to 16 tokens of Q4_K / Q5_K, 5 to 16 of Q6_K, `narrow_k`).
/// 15: scalar four-token kernels (Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K), and the scalar tier's
///    kernels compiled for AVX2 + FMA where the CPU has them (`scalar_x86`).
/// 16: AVX2 Q4_0 / Q5_0 / Q8_0 token groups with AVX-VNNI's `vpdpbusd` where the CPU has
///    it; AMX K tiles prefetched, their unpacking in fewer operations.
/// 17: BF16 in the reference's `vdpbf16ps` order, with AVX-512 BF16 and AVX2 kernels (a
///    cached plan could hold the scalar one, now the slowest).
/// 18: AVX-512 VBMI grid kernels (IQ2_XXS, IQ2_XS, IQ3_XXS, IQ3_S) decoding a block in
///    registers; the VNNI tiles of Q5_K, Q3_K, Q2_K, IQ4_XS, IQ1_M and the grids where
///    AMX takes Q4_K / Q6_K (their activations tiled a second time in the VNNI layout).
/// 19: the Q6_K, Q2_K and Q3_K VNNI tiles join two sub-blocks' quads in one dword (one
///    `vpdpwssd` instead of two).
/// 20: AVX-512 four-row Q2_K and Q3_K decode kernels.
/// 21: the Q2_K and Q3_K VNNI tiles read levels scaled when unpacked (no `vpdpwssd`).
pub const KERNELS_REVISION: u32 = 21;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_rules_pick_the_first_candidate() {
        for tier in crate::supported_tiers() {
            let plan = KernelPlan::default_rules(tier);
            for ty in planned_formats() {
                let p = plan.get(ty);
                assert!(
                    decode_candidates(tier, ty).contains(&p.decode),
                    "{ty} {tier}"
                );
                assert!(
                    prefill_candidates(tier, ty).contains(&p.prefill),
                    "{ty} {tier}"
                );
            }
        }
        let scalar = KernelPlan::default_rules(CpuTier::Scalar).get(GgmlType::Q8_0);
        assert_eq!(scalar.decode, DecodeKernel::Rows1(CpuTier::Scalar));
        assert_eq!(scalar.prefill, PrefillKernel::Tokens4(CpuTier::Scalar));
        let q4_1 = KernelPlan::default_rules(CpuTier::Scalar).get(GgmlType::Q4_1);
        assert_eq!(q4_1.prefill, PrefillKernel::PerToken);
    }

    #[test]
    fn specs_round_trip_and_bad_items_are_named() {
        let mut plan = KernelPlan::default_rules(CpuTier::Scalar);
        assert!(!plan
            .apply_spec("q8_0.decode=scalar, Q4_K.prefill=per-token")
            .unwrap());
        assert_eq!(plan.chosen().len(), 2);
        let mut again = KernelPlan::default_rules(CpuTier::Scalar);
        again.apply_spec(&plan.to_spec()).unwrap();
        assert_eq!(again, plan);
        assert!(plan.apply_spec("default").unwrap());
        assert!(plan.chosen().is_empty());
        for bad in [
            "q8_0",
            "q8_0=avx2",
            "q8_0.middle=avx2",
            "q9_0.decode=avx2",
            "q8_0.decode=avx7",
            "q8_0.prefill=avx2",
        ] {
            let e = plan.apply_spec(bad).unwrap_err();
            assert!(matches!(e, PlanError::BadItem { .. }), "{bad}: {e}");
        }
        // A kernel that exists but cannot run at the scalar tier.
        let e = plan.apply_spec("q8_0.decode=avx2").unwrap_err();
        assert!(matches!(e, PlanError::NotEligible { .. }), "{e}");
        assert!(e.to_string().contains("eligible: scalar"), "{e}");
        // `*` applies wherever it can.
        plan.apply_spec("*.decode=scalar").unwrap();
        assert_eq!(plan.chosen().len(), planned_formats().count());
    }
}
