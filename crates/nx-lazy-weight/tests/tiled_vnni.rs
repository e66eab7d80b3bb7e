//! The tiled prefill kernels of the AVX-512 VNNI tier with AMX turned off (`NX_AMX=0`),
//! against `dot_row` bit for bit. On a CPU with AMX, `tests/multi_token.rs` runs the
//! AMX path for the K formats; this file keeps their VNNI tiles tested too. One test
//! only: the variable is read once per process, before any matmul.

mod common;

use common::check_matmul_against_dot_row;
use nx_lazy_weight::GgmlType;

#[test]
fn tiled_vnni_kernels_without_amx_equal_dot_row() {
    std::env::set_var("NX_AMX", "0");
    for ty in [
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::IQ4_NL,
        GgmlType::IQ4_XS,
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ2_S,
        GgmlType::IQ3_XXS,
        GgmlType::IQ3_S,
        GgmlType::IQ1_M,
        GgmlType::Q3_K,
        GgmlType::Q5_K,
        GgmlType::Q4_1,
        GgmlType::Q5_1,
        GgmlType::Q2_K,
    ] {
        check_matmul_against_dot_row(ty, &[16, 33, 37]);
    }
}
