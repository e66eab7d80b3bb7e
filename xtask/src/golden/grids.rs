//! `cargo xtask golden grids`: the lattice tables of the IQ1–IQ3 grid formats, taken from
//! the pinned llama.cpp sdist's `ggml/src/ggml-common.h`.
//!
//! The formats are defined by these tables (which 8 or 4 magnitudes an index stands for),
//! so nx carries them as data. The generator reads each `GGML_TABLE_BEGIN(type, name, n)`
//! table, checks that every entry is made of the format's levels only, and writes each
//! entry as a `u16` of level indices (2 bits an element for the three-level IQ2 and IQ1
//! grids, 3 bits for the eight-level IQ3 grids), element 0 in the low bits. The crate
//! expands them to bytes at compile time (`formats/grids.rs`). Output:
//! `crates/nx-lazy-weight/src/formats/grid_tables.rs`; `--check` regenerates in memory
//! and compares.

use anyhow::{bail, Context, Result};

use crate::fetch::{ensure_llama_src, llama_src_dir};
use crate::util::workspace_root;

/// Where the generated file lives, relative to the workspace root.
const OUT: &str = "crates/nx-lazy-weight/src/formats/grid_tables.rs";

/// One table: ggml's name, entries, bytes per entry, its levels (as the bytes stored) and
/// the name of the Rust constant.
struct Table {
    ggml_name: &'static str,
    entries: usize,
    elements: usize,
    levels: &'static [u8],
    rust_name: &'static str,
}

const TABLES: &[Table] = &[
    Table {
        ggml_name: "iq2xxs_grid",
        entries: 256,
        elements: 8,
        levels: &[0x08, 0x19, 0x2b],
        rust_name: "IQ2XXS_CODES",
    },
    Table {
        ggml_name: "iq2xs_grid",
        entries: 512,
        elements: 8,
        levels: &[0x08, 0x19, 0x2b],
        rust_name: "IQ2XS_CODES",
    },
    Table {
        ggml_name: "iq2s_grid",
        entries: 1024,
        elements: 8,
        levels: &[0x08, 0x19, 0x2b],
        rust_name: "IQ2S_CODES",
    },
    Table {
        ggml_name: "iq3xxs_grid",
        entries: 256,
        elements: 4,
        levels: &[0x04, 0x0c, 0x14, 0x1c, 0x24, 0x2c, 0x34, 0x3e],
        rust_name: "IQ3XXS_CODES",
    },
    Table {
        ggml_name: "iq3s_grid",
        entries: 512,
        elements: 4,
        levels: &[0x01, 0x03, 0x05, 0x07, 0x09, 0x0b, 0x0d, 0x0f],
        rust_name: "IQ3S_CODES",
    },
    Table {
        ggml_name: "iq1s_grid",
        entries: 2048,
        elements: 8,
        // −1, 0, +1 as stored bytes.
        levels: &[0xff, 0x00, 0x01],
        rust_name: "IQ1S_CODES",
    },
];

/// Regenerates (or, with `check`, verifies) the grid tables.
pub fn run(check: bool) -> Result<()> {
    ensure_llama_src()?;
    let header = llama_src_dir().join("ggml/src/ggml-common.h");
    let text =
        std::fs::read_to_string(&header).with_context(|| format!("read {}", header.display()))?;
    let generated = render(&text)?;
    let path = workspace_root().join(OUT);
    if check {
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if committed != generated {
            bail!("{OUT} differs from ggml-common.h; run `cargo xtask golden grids` to regenerate");
        }
    } else {
        std::fs::write(&path, generated).with_context(|| format!("write {}", path.display()))?;
    }
    eprintln!(
        "golden grids: {} {} tables in {OUT}",
        if check { "checked" } else { "wrote" },
        TABLES.len()
    );
    Ok(())
}

/// The Rust file for the tables found in `header`.
fn render(header: &str) -> Result<String> {
    let mut out = String::from(
        "//! The IQ1–IQ3 lattice tables as level indices, written by `cargo xtask golden grids`\n\
         //! from the pinned llama.cpp sdist's `ggml/src/ggml-common.h`; do not edit.\n\
         //! Entry `i` packs element `j` in bits `b·j..b·j+b` (b = 2 for three levels, 3 for\n\
         //! eight); `formats/grids.rs` expands them.\n",
    );
    for table in TABLES {
        let values = table_values(header, table.ggml_name)?;
        if values.len() != table.entries {
            bail!(
                "{} has {} entries, expected {}",
                table.ggml_name,
                values.len(),
                table.entries
            );
        }
        let bits = if table.levels.len() <= 4 { 2 } else { 3 };
        let codes = values
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                encode(v, table, bits).with_context(|| format!("{}[{i}]", table.ggml_name))
            })
            .collect::<Result<Vec<u16>>>()?;
        out.push_str(&format!(
            "\n/// `{}` of ggml-common.h.\npub(crate) const {}: [u16; {}] = [\n",
            table.ggml_name, table.rust_name, table.entries
        ));
        for line in codes.chunks(12) {
            let items: Vec<String> = line.iter().map(|c| format!("0x{c:04x}")).collect();
            out.push_str(&format!("    {},\n", items.join(", ")));
        }
        out.push_str("];\n");
    }
    Ok(out)
}

/// One entry as level indices.
fn encode(value: u64, table: &Table, bits: u32) -> Result<u16> {
    let mut code = 0u16;
    for j in 0..table.elements {
        let byte = (value >> (8 * j)) as u8;
        let Some(index) = table.levels.iter().position(|&l| l == byte) else {
            bail!("byte {byte:#04x} is not one of the format's levels");
        };
        code |= (index as u16) << (bits * j as u32);
    }
    if table.elements < 8 && value >> (8 * table.elements) != 0 {
        bail!("value {value:#x} is wider than {} bytes", table.elements);
    }
    Ok(code)
}

/// The numbers between `GGML_TABLE_BEGIN(type, name, size)` and `GGML_TABLE_END()`.
fn table_values(header: &str, name: &str) -> Result<Vec<u64>> {
    let start_marker = format!(", {name},");
    let begin = header
        .lines()
        .position(|l| l.starts_with("GGML_TABLE_BEGIN(") && l.contains(&start_marker))
        .with_context(|| format!("no table {name} in ggml-common.h"))?;
    let mut values = Vec::new();
    for line in header.lines().skip(begin + 1) {
        if line.starts_with("GGML_TABLE_END") {
            return Ok(values);
        }
        for item in line.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let hex = item
                .strip_prefix("0x")
                .with_context(|| format!("{name}: {item:?} is not a hex literal"))?;
            values.push(u64::from_str_radix(hex, 16).with_context(|| format!("{name}: {item:?}"))?);
        }
    }
    bail!("table {name} has no GGML_TABLE_END")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_encodes_a_small_table() {
        let header = "x\nGGML_TABLE_BEGIN(uint32_t, iq3xxs_grid, 2)\n    0x04040404, 0x3e0c0404,\n\
                      GGML_TABLE_END()\n";
        let values = table_values(header, "iq3xxs_grid").unwrap();
        assert_eq!(values, vec![0x0404_0404, 0x3e0c_0404]);
        let table = &TABLES[3];
        assert_eq!(encode(values[0], table, 3).unwrap(), 0);
        // Element 2 is 0x0c (index 1), element 3 is 0x3e (index 7).
        assert_eq!(encode(values[1], table, 3).unwrap(), (1 << 6) | (7 << 9));
        assert!(encode(0x0404_0405, table, 3).is_err());
        assert!(table_values(header, "iq2s_grid").is_err());
    }
}
