//! GPUs of this node: NVML where the library is present, declared flags otherwise.
//!
//! NVML is loaded at run time (`nvml-wrapper` uses `dlopen`), so the worker runs on machines
//! without an NVIDIA driver and simply finds no GPUs there. Declared flags win over
//! detection: `--gpus N` makes the node advertise N devices (indices 0..N, with NVML's uuids
//! where those indices exist), which is how the all-in-one cluster simulates GPU nodes.
//!
//! Indices are NVML's (PCI bus order). CUDA orders devices fastest-first unless
//! `CUDA_DEVICE_ORDER=PCI_BUS_ID`, so the job environment sets that (unless the job did).

use tandem_proto::v1::GpuDevice;

/// A device NVML reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DetectedGpu {
    pub index: u32,
    /// Marketing name, e.g. "NVIDIA H100 80GB HBM3".
    pub name: String,
    pub uuid: String,
}

/// Asks NVML for the devices; `Err` says why there is no answer (no library, no driver).
pub fn detect() -> Result<Vec<DetectedGpu>, String> {
    let nvml = nvml_wrapper::Nvml::init().map_err(|e| format!("NVML unavailable: {e}"))?;
    let count = nvml
        .device_count()
        .map_err(|e| format!("NVML device count: {e}"))?;
    (0..count)
        .map(|i| {
            let dev = nvml
                .device_by_index(i)
                .map_err(|e| format!("NVML device {i}: {e}"))?;
            Ok(DetectedGpu {
                index: dev.index().unwrap_or(i),
                name: dev.name().unwrap_or_default(),
                uuid: dev.uuid().unwrap_or_default(),
            })
        })
        .collect()
}

/// A short, lower-case type name from a device name, as used in `--gres=gpu:TYPE:N`:
/// "NVIDIA H100 80GB HBM3" -> "h100", "Tesla V100-SXM2-16GB" -> "v100",
/// "NVIDIA GeForce RTX 4090" -> "rtx4090".
pub fn gpu_type_from_name(name: &str) -> String {
    const VENDOR_WORDS: [&str; 5] = ["nvidia", "tesla", "geforce", "quadro", "titan"];
    let words: Vec<String> = name
        .split_whitespace()
        .map(str::to_ascii_lowercase)
        .filter(|w| !VENDOR_WORDS.contains(&w.as_str()))
        .collect();
    let Some(first) = words.first() else {
        return String::new();
    };
    let model = first.split('-').next().unwrap_or(first);
    match (model, words.get(1)) {
        ("rtx" | "gtx", Some(number)) => {
            format!("{model}{}", number.split('-').next().unwrap_or(""))
        }
        _ => model.to_owned(),
    }
}

/// The devices to advertise. `declared_count`/`declared_type` come from `--gpus` and
/// `--gpu-type`; `detected` is NVML's answer.
pub fn resolve(
    declared_count: Option<u32>,
    declared_type: Option<&str>,
    detected: &Result<Vec<DetectedGpu>, String>,
) -> Vec<GpuDevice> {
    let found: &[DetectedGpu] = detected.as_deref().unwrap_or_default();
    let type_of = |d: Option<&DetectedGpu>| match (declared_type, d) {
        (Some(t), _) => t.to_owned(),
        (None, Some(d)) => gpu_type_from_name(&d.name),
        (None, None) => String::new(),
    };
    match declared_count {
        Some(n) => (0..n)
            .map(|index| {
                let d = found.iter().find(|d| d.index == index);
                GpuDevice {
                    index,
                    gpu_type: type_of(d),
                    uuid: d.map(|d| d.uuid.clone()).unwrap_or_default(),
                }
            })
            .collect(),
        None => found
            .iter()
            .map(|d| GpuDevice {
                index: d.index,
                gpu_type: type_of(Some(d)),
                uuid: d.uuid.clone(),
            })
            .collect(),
    }
}

/// The node's GPU type for `Tres.gpu_type`: the common type, or empty when mixed or untyped.
pub fn common_type(devices: &[GpuDevice]) -> String {
    match devices.split_first() {
        Some((first, rest)) if rest.iter().all(|d| d.gpu_type == first.gpu_type) => {
            first.gpu_type.clone()
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100(index: u32) -> DetectedGpu {
        DetectedGpu {
            index,
            name: "NVIDIA H100 80GB HBM3".into(),
            uuid: format!("GPU-{index}"),
        }
    }

    #[test]
    fn type_names_from_device_names() {
        let cases = [
            ("NVIDIA H100 80GB HBM3", "h100"),
            ("NVIDIA H200", "h200"),
            ("NVIDIA A100-SXM4-80GB", "a100"),
            ("Tesla V100-SXM2-16GB", "v100"),
            ("NVIDIA GeForce RTX 4090", "rtx4090"),
            ("NVIDIA L40S", "l40s"),
            ("", ""),
        ];
        for (name, want) in cases {
            assert_eq!(gpu_type_from_name(name), want, "{name}");
        }
    }

    #[test]
    fn without_nvml_the_declared_gpus_are_advertised() {
        let none: Result<Vec<DetectedGpu>, String> = Err("NVML unavailable".into());
        let gpus = resolve(Some(2), Some("a100"), &none);
        assert_eq!(gpus.len(), 2);
        assert_eq!((gpus[1].index, gpus[1].gpu_type.as_str()), (1, "a100"));
        assert!(resolve(None, Some("a100"), &none).is_empty());
        assert_eq!(common_type(&gpus), "a100");
    }

    #[test]
    fn detection_is_used_unless_flags_override() {
        let found = Ok(vec![h100(0), h100(1)]);
        let gpus = resolve(None, None, &found);
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[0].gpu_type, "h100");
        assert_eq!(gpus[1].uuid, "GPU-1");
        // Declared count wins; detected uuids are kept where indices exist.
        let gpus = resolve(Some(3), Some("big"), &found);
        assert_eq!(gpus.len(), 3);
        assert!(gpus.iter().all(|g| g.gpu_type == "big"));
        assert_eq!(gpus[0].uuid, "GPU-0");
        assert_eq!(gpus[2].uuid, "");
        assert!(resolve(Some(0), None, &found).is_empty());
    }

    #[test]
    fn mixed_types_have_no_common_type() {
        let mut gpus = resolve(Some(2), Some("a"), &Err(String::new()));
        gpus[1].gpu_type = "b".into();
        assert_eq!(common_type(&gpus), "");
        assert_eq!(common_type(&[]), "");
    }

    #[test]
    fn detect_answers_without_panicking() {
        // No GPU on CI machines: detection must fail cleanly, not crash the worker. Where
        // NVML exists it must return consistent indices.
        match detect() {
            Err(why) => assert!(why.contains("NVML")),
            Ok(devs) => assert!(devs.iter().all(|d| !d.uuid.is_empty())),
        }
    }
}
