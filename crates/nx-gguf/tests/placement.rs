//! `Gguf::open_placed`: a file opened resident has the mapped file's bytes, header and
//! tensors, and a file that is not GGUF fails the same way in both placements.

use nx_gguf::{GgmlType, Gguf, GgufWriter, Value};
use nx_syscalls::Placement;

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("nx-gguf-placement-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
#[cfg_attr(miri, ignore = "Miri cannot map files")]
fn resident_and_mapped_files_agree() {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", Value::String("llama".into()));
    let data: Vec<u8> = (0..4096u32)
        .flat_map(|i| (i as f32).to_le_bytes())
        .collect();
    w.add_tensor("t.weight", GgmlType::F32, vec![64, 64], data.clone());
    let path = scratch("ok.gguf");
    std::fs::write(&path, w.to_bytes()).unwrap();

    let mapped = Gguf::open_placed(&path, Placement::Mapped).unwrap();
    let resident = Gguf::open_placed(&path, Placement::Resident).unwrap();
    assert_eq!(mapped.placement(), Placement::Mapped);
    assert_eq!(resident.placement(), Placement::Resident);
    assert!(resident.mapped_file().is_none());
    assert_eq!(mapped.bytes(), resident.bytes());
    assert_eq!(resident.architecture().unwrap(), "llama");
    let info = resident.tensor("t.weight").unwrap();
    assert_eq!(resident.tensor_bytes(info), &data[..]);

    let bad = scratch("bad.gguf");
    std::fs::write(&bad, b"not a gguf file at all").unwrap();
    for placement in [Placement::Mapped, Placement::Resident] {
        let err = Gguf::open_placed(&bad, placement).unwrap_err().to_string();
        assert!(err.contains("not a GGUF file"), "{placement:?}: {err}");
    }
    assert!(Gguf::read_resident(scratch("missing.gguf")).is_err());
}
