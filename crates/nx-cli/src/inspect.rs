//! `nx inspect`: metadata, tensor table and per-type totals of a GGUF file, or the
//! dequantized values of one tensor's rows.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use nx_gguf::{Gguf, Value};
use serde_json::json;

/// Arguments of `nx inspect`.
#[derive(clap::Args)]
pub struct InspectArgs {
    /// The GGUF file.
    pub file: PathBuf,
    /// Print machine-readable JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Print the dequantized values of this tensor (one row a line).
    #[arg(long, value_name = "NAME")]
    pub tensor: Option<String>,
    /// Rows to print with --tensor, as A..B (end exclusive) or a single row A.
    /// Default: the first row.
    #[arg(long, value_name = "A..B", requires = "tensor")]
    pub rows: Option<String>,
}

pub fn run(args: &InspectArgs) -> Result<()> {
    let gguf = Gguf::open(&args.file).with_context(|| format!("{}", args.file.display()))?;
    match &args.tensor {
        Some(name) => print_rows(&gguf, name, args.rows.as_deref(), args.json),
        None if args.json => print_json(&gguf),
        None => print_text(&gguf),
    }
}

/// A metadata value for humans: long arrays summarised.
fn summarize(v: &Value) -> String {
    match v {
        Value::String(s) => {
            let one_line = s.replace('\n', "\\n");
            if one_line.chars().count() > 120 {
                let head: String = one_line.chars().take(117).collect();
                format!("{head:?}… ({} bytes)", s.len())
            } else {
                format!("{one_line:?}")
            }
        }
        Value::Array(a) => {
            let n = a.values.len();
            let shown: Vec<String> = a.values.iter().take(6).map(summarize).collect();
            let more = if n > 6 { ", …" } else { "" };
            format!(
                "[{}{}] ({} × {})",
                shown.join(", "),
                more,
                n,
                a.elem_type.name()
            )
        }
        Value::F32(x) => format!("{x}"),
        Value::F64(x) => format!("{x}"),
        other => other
            .as_i64()
            .map(|x| x.to_string())
            .or_else(|| other.as_u64().map(|x| x.to_string()))
            .or_else(|| other.as_bool().map(|b| b.to_string()))
            .unwrap_or_default(),
    }
}

fn to_json(v: &Value, summarise_arrays: bool) -> serde_json::Value {
    match v {
        Value::String(s) => json!(s),
        Value::Bool(b) => json!(b),
        Value::F32(x) => json!(x),
        Value::F64(x) => json!(x),
        Value::Array(a) if summarise_arrays && a.values.len() > 64 => json!({
            "type": format!("array of {}", a.elem_type.name()),
            "len": a.values.len(),
            "head": a.values.iter().take(8).map(|x| to_json(x, true)).collect::<Vec<_>>(),
        }),
        Value::Array(a) => json!(a
            .values
            .iter()
            .map(|x| to_json(x, summarise_arrays))
            .collect::<Vec<_>>()),
        other => other
            .as_i64()
            .map(|x| json!(x))
            .or_else(|| other.as_u64().map(|x| json!(x)))
            .unwrap_or(serde_json::Value::Null),
    }
}

fn type_totals(gguf: &Gguf) -> BTreeMap<&'static str, (usize, u64)> {
    let mut totals = BTreeMap::new();
    for t in gguf.tensors() {
        let e = totals.entry(t.ggml_type.name()).or_insert((0usize, 0u64));
        e.0 += 1;
        e.1 += t.n_bytes;
    }
    totals
}

fn print_text(gguf: &Gguf) -> Result<()> {
    let h = gguf.header();
    let m = gguf.metadata();
    let mut out = std::io::stdout().lock();
    let arch = m.get_str("general.architecture").unwrap_or("(none)");
    let name = m.get_str("general.name").unwrap_or("(none)");
    writeln!(out, "file:          {} bytes", gguf.bytes().len())?;
    writeln!(out, "gguf version:  {}", h.version)?;
    writeln!(out, "architecture:  {arch}")?;
    writeln!(out, "name:          {name}")?;
    writeln!(out, "alignment:     {}", h.alignment)?;
    writeln!(out, "data offset:   {}", h.data_offset)?;
    writeln!(out, "\nmetadata ({} keys):", m.len())?;
    for (k, v) in m.iter() {
        writeln!(
            out,
            "  {k:<44} {:<10} {}",
            v.type_description(),
            summarize(v)
        )?;
    }
    writeln!(out, "\ntensors ({}):", h.tensors.len())?;
    writeln!(
        out,
        "  {:<40} {:<6} {:<22} {:>12}",
        "name", "type", "shape", "bytes"
    )?;
    for t in &h.tensors {
        let shape = format!("{:?}", t.ne);
        writeln!(
            out,
            "  {:<40} {:<6} {:<22} {:>12}",
            t.name,
            t.ggml_type.name(),
            shape,
            t.n_bytes
        )?;
    }
    writeln!(out, "\ntotals per type:")?;
    let mut all = (0usize, 0u64);
    for (ty, (n, bytes)) in type_totals(gguf) {
        writeln!(out, "  {ty:<6} {n:>5} tensors {bytes:>14} bytes")?;
        all.0 += n;
        all.1 += bytes;
    }
    writeln!(
        out,
        "  {:<6} {:>5} tensors {:>14} bytes",
        "all", all.0, all.1
    )?;
    Ok(())
}

fn print_json(gguf: &Gguf) -> Result<()> {
    let h = gguf.header();
    let metadata: serde_json::Map<String, serde_json::Value> = h
        .metadata
        .iter()
        .map(|(k, v)| (k.to_string(), to_json(v, true)))
        .collect();
    let tensors: Vec<_> = h
        .tensors
        .iter()
        .map(|t| {
            json!({"name": t.name, "type": t.ggml_type.name(), "shape": t.ne,
                   "offset": h.data_offset + t.offset, "bytes": t.n_bytes})
        })
        .collect();
    let totals: serde_json::Map<String, serde_json::Value> = type_totals(gguf)
        .into_iter()
        .map(|(ty, (n, b))| (ty.to_string(), json!({"tensors": n, "bytes": b})))
        .collect();
    let doc = json!({
        "file_bytes": gguf.bytes().len(),
        "version": h.version,
        "architecture": h.metadata.get_str("general.architecture").ok(),
        "name": h.metadata.get_str("general.name").ok(),
        "alignment": h.alignment,
        "data_offset": h.data_offset,
        "metadata": metadata,
        "tensors": tensors,
        "totals": totals,
    });
    println!("{}", serde_json::to_string_pretty(&doc)?);
    Ok(())
}

/// Parses `A..B`, `A..`, `..B` or `A` against `n_rows`.
fn parse_rows(spec: Option<&str>, n_rows: u64) -> Result<std::ops::Range<u64>> {
    let Some(spec) = spec else {
        return Ok(0..n_rows.min(1));
    };
    let num = |s: &str, default: u64| -> Result<u64> {
        if s.is_empty() {
            Ok(default)
        } else {
            s.trim()
                .parse()
                .with_context(|| format!("--rows {spec:?}: {s:?} is not a row number"))
        }
    };
    let (a, b) = match spec.split_once("..") {
        Some((a, b)) => (num(a, 0)?, num(b, n_rows)?),
        None => {
            let a = num(spec, 0)?;
            (a, a.saturating_add(1))
        }
    };
    if a >= b || b > n_rows {
        bail!("--rows {spec:?} is outside the tensor's {n_rows} rows");
    }
    Ok(a..b)
}

fn print_rows(gguf: &Gguf, name: &str, rows: Option<&str>, json_out: bool) -> Result<()> {
    let info = gguf.tensor(name).with_context(|| {
        format!("no tensor named {name:?} (see `nx inspect FILE` for the list)")
    })?;
    let weight = nx_lazy_weight::LazyWeight::new(info, gguf.tensor_bytes(info))?;
    let range = parse_rows(rows, weight.n_rows() as u64)?;
    let mut row = vec![0f32; weight.row_len()];
    let mut out = std::io::stdout().lock();
    for r in range {
        weight.dequantize_row(r as usize, &mut row)?;
        if json_out {
            let vals: Vec<String> = row.iter().map(|x| format_sig9(*x)).collect();
            writeln!(out, "{{\"row\":{r},\"values\":[{}]}}", vals.join(","))?;
        } else {
            let vals: Vec<String> = row.iter().map(|x| format_sig9(*x)).collect();
            writeln!(out, "{}", vals.join(" "))?;
        }
    }
    Ok(())
}

/// A float with 9 significant digits (enough to round-trip an f32).
fn format_sig9(x: f32) -> String {
    if !x.is_finite() {
        return if x.is_nan() {
            "NaN".into()
        } else if x > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    let s = format!("{x:.8e}");
    // Prefer plain notation when it is as short; keep the exponent form otherwise.
    match s.parse::<f32>() {
        Ok(v) if v == x => {
            let plain = format!("{}", x);
            if plain.len() <= s.len() {
                plain
            } else {
                s
            }
        }
        _ => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_spec() {
        assert_eq!(parse_rows(None, 10).unwrap(), 0..1);
        assert_eq!(parse_rows(Some("2..5"), 10).unwrap(), 2..5);
        assert_eq!(parse_rows(Some("3"), 10).unwrap(), 3..4);
        assert_eq!(parse_rows(Some("8.."), 10).unwrap(), 8..10);
        assert!(parse_rows(Some("5..2"), 10).is_err());
        assert!(parse_rows(Some("0..11"), 10).is_err());
        assert!(parse_rows(Some("x"), 10).is_err());
    }

    #[test]
    fn sig9_round_trips() {
        for x in [0.1f32, 1.0e-7, 123456.79, -3.3333333, 0.0] {
            assert_eq!(format_sig9(x).parse::<f32>().unwrap(), x);
        }
    }
}
