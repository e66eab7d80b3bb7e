//! ggml tensor types: ids, block sizes and byte sizes.
//!
//! Every type of the pinned ggml's `enum ggml_type` is known here, so a file whose
//! tensors use a type nx cannot compute with still parses (`nx inspect` lists it) and
//! the model loader names the tensor and the type; ids ggml removed or never used are
//! rejected at parse time.

/// One row of [`TYPES`]: a type's id, name, elements per block and bytes per block.
struct TypeInfo {
    ty: GgmlType,
    id: u32,
    name: &'static str,
    block_size: usize,
    type_size: usize,
}

macro_rules! ggml_types {
    ($($variant:ident = $id:literal, $block:expr, $bytes:expr;)*) => {
        /// A ggml tensor element type (the ids of the pinned ggml; others are rejected
        /// at parse time).
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum GgmlType {
            $(
                #[doc = concat!("ggml type ", stringify!($id), ".")]
                $variant,
            )*
        }

        const TYPES: &[TypeInfo] = &[
            $(TypeInfo {
                ty: GgmlType::$variant,
                id: $id,
                name: stringify!($variant),
                block_size: $block,
                type_size: $bytes,
            },)*
        ];

        impl GgmlType {
            /// Every known type, in id order.
            pub const ALL: &'static [GgmlType] = &[$(GgmlType::$variant),*];
        }
    };
}

const QK_K: usize = 256;

// Block sizes and bytes from ggml-common.h's `static_assert`s on each block struct.
ggml_types! {
    F32 = 0, 1, 4;
    F16 = 1, 1, 2;
    Q4_0 = 2, 32, 2 + 16;
    Q4_1 = 3, 32, 2 + 2 + 16;
    Q5_0 = 6, 32, 2 + 4 + 16;
    Q5_1 = 7, 32, 2 + 2 + 4 + 16;
    Q8_0 = 8, 32, 2 + 32;
    Q8_1 = 9, 32, 2 + 2 + 32;
    Q2_K = 10, QK_K, QK_K / 16 + QK_K / 4 + 2 + 2;
    Q3_K = 11, QK_K, QK_K / 8 + QK_K / 4 + 12 + 2;
    Q4_K = 12, QK_K, 2 + 2 + 12 + QK_K / 2;
    Q5_K = 13, QK_K, 2 + 2 + 12 + QK_K / 8 + QK_K / 2;
    Q6_K = 14, QK_K, QK_K / 2 + QK_K / 4 + QK_K / 16 + 2;
    Q8_K = 15, QK_K, 4 + QK_K + 2 * (QK_K / 16);
    IQ2_XXS = 16, QK_K, 2 + 2 * (QK_K / 8);
    IQ2_XS = 17, QK_K, 2 + 2 * (QK_K / 8) + QK_K / 32;
    IQ3_XXS = 18, QK_K, 2 + 3 * (QK_K / 8);
    IQ1_S = 19, QK_K, 2 + QK_K / 8 + QK_K / 16;
    IQ4_NL = 20, 32, 2 + 16;
    IQ3_S = 21, QK_K, 2 + 13 * (QK_K / 32) + QK_K / 64;
    IQ2_S = 22, QK_K, 2 + QK_K / 4 + QK_K / 16;
    IQ4_XS = 23, QK_K, 2 + 2 + QK_K / 64 + QK_K / 2;
    I8 = 24, 1, 1;
    I16 = 25, 1, 2;
    I32 = 26, 1, 4;
    I64 = 27, 1, 8;
    F64 = 28, 1, 8;
    IQ1_M = 29, QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32;
    BF16 = 30, 1, 2;
    TQ1_0 = 34, QK_K, 2 + QK_K / 64 + (QK_K - 4 * QK_K / 64) / 5;
    TQ2_0 = 35, QK_K, 2 + QK_K / 4;
    MXFP4 = 39, 32, 1 + 16;
    NVFP4 = 40, 64, 4 + 32;
    Q1_0 = 41, 128, 2 + 128 / 8;
    Q2_0 = 42, 64, 2 + 64 / 4;
}

impl GgmlType {
    const fn info(self) -> &'static TypeInfo {
        // The table lists the variants in declaration order.
        &TYPES[self as usize]
    }

    /// The type for a ggml type id, if nx knows it.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TYPES.iter().find(|t| t.id == id).map(|t| t.ty)
    }

    /// The ggml type id as stored in a GGUF tensor info.
    pub fn id(self) -> u32 {
        self.info().id
    }

    /// The name ggml uses for the type.
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// Elements per block.
    pub const fn block_size(self) -> usize {
        self.info().block_size
    }

    /// Bytes per block.
    pub const fn type_size(self) -> usize {
        self.info().type_size
    }

    /// Bytes taken by `n_elements` values, or `None` when `n_elements` is not a whole
    /// number of blocks or the size overflows.
    pub fn row_bytes(self, n_elements: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !n_elements.is_multiple_of(bs) {
            return None;
        }
        (n_elements / bs).checked_mul(self.type_size() as u64)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for (i, &t) in GgmlType::ALL.iter().enumerate() {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_eq!(TYPES[i].ty, t, "table order");
        }
        // Ids ggml removed (Q4_2, Q4_3, the repacked Q4_0_4_4 … IQ4_NL_8_8) and past the end.
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 43, 99, u32::MAX] {
            assert_eq!(GgmlType::from_id(id), None, "{id}");
        }
        assert_eq!(GgmlType::Q4_K.row_bytes(512), Some(288));
        assert_eq!(GgmlType::Q4_K.row_bytes(640), None);
        assert_eq!(GgmlType::F32.row_bytes(u64::MAX), None);
    }

    #[test]
    fn sizes_are_ggmls() {
        // Values printed by ggml's `ggml_type_size` / `ggml_blck_size` for the pinned tree.
        let table = [
            (GgmlType::Q2_K, 84),
            (GgmlType::Q3_K, 110),
            (GgmlType::Q4_K, 144),
            (GgmlType::Q5_K, 176),
            (GgmlType::Q6_K, 210),
            (GgmlType::Q8_K, 292),
            (GgmlType::IQ2_XXS, 66),
            (GgmlType::IQ2_XS, 74),
            (GgmlType::IQ3_XXS, 98),
            (GgmlType::IQ1_S, 50),
            (GgmlType::IQ4_NL, 18),
            (GgmlType::IQ3_S, 110),
            (GgmlType::IQ2_S, 82),
            (GgmlType::IQ4_XS, 136),
            (GgmlType::IQ1_M, 56),
            (GgmlType::TQ1_0, 54),
            (GgmlType::TQ2_0, 66),
            (GgmlType::MXFP4, 17),
            (GgmlType::NVFP4, 36),
        ];
        for (t, bytes) in table {
            assert_eq!(t.type_size(), bytes, "{t}");
        }
    }
}
