//! Facts of the machine and the clock that the bench and loadtest reports print: the CPU
//! model, the load average, a process's peak RSS, the UTC date, the target directory.

use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::util::cargo_metadata;

/// `VmHWM` from a `/proc/<pid>/status` text, in KiB.
pub fn vm_hwm_kib(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// `(YYYY-MM-DD, HH:MM)` in UTC for a Unix time in seconds.
pub fn utc_date_time(unix_secs: u64) -> (String, String) {
    let days = (unix_secs / 86_400) as i64;
    let secs_of_day = unix_secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    (
        format!("{y:04}-{m:02}-{d:02}"),
        format!("{:02}:{:02}", secs_of_day / 3600, secs_of_day % 3600 / 60),
    )
}

/// Proleptic Gregorian (year, month, day) of `days` since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    // Count in 400-year eras starting on 0000-03-01, so the leap day ends each year.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_from_march + 2) / 5 + 1) as u32;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `model name` from `/proc/cpuinfo`, or "unknown CPU".
pub fn cpu_model() -> String {
    nx_syscalls::cpu_model().unwrap_or_else(|| "unknown CPU".to_string())
}

pub use nx_syscalls::cpu_model_from;

pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_string())
}

/// Cargo's target directory of this workspace.
pub fn target_dir() -> Result<PathBuf> {
    let meta = cargo_metadata()?;
    let dir = meta["target_directory"]
        .as_str()
        .context("cargo metadata has no target_directory")?;
    Ok(PathBuf::from(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_rss_parsing() {
        let status = "Name:\tx\nVmPeak:\t  9000 kB\nVmHWM:\t    1234 kB\nVmRSS:\t 1000 kB\n";
        assert_eq!(vm_hwm_kib(status), Some(1234));
        assert_eq!(vm_hwm_kib("Name:\tx\n"), None);
    }

    #[test]
    fn utc_dates_match_gnu_date() {
        // Expected values from `date -u -d @SECS '+%F %H:%M'`.
        assert_eq!(utc_date_time(0), ("1970-01-01".into(), "00:00".into()));
        assert_eq!(
            utc_date_time(951_868_800),
            ("2000-03-01".into(), "00:00".into())
        );
        assert_eq!(
            utc_date_time(1_709_164_800),
            ("2024-02-29".into(), "00:00".into())
        );
        assert_eq!(
            utc_date_time(4_102_444_799),
            ("2099-12-31".into(), "23:59".into())
        );
        assert_eq!(
            utc_date_time(1_795_996_800),
            ("2026-11-30".into(), "00:00".into())
        );
    }

    #[test]
    fn cpu_model_is_the_first_model_name() {
        let text = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) \
                    Processor\nprocessor\t: 1\nmodel name\t: other\n";
        assert_eq!(
            cpu_model_from(text).as_deref(),
            Some("Intel(R) Xeon(R) Processor")
        );
        assert_eq!(cpu_model_from("processor: 0\n"), None);
        let amd = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n\
                   model name\t: AMD EPYC\nstepping\t: 1\n";
        assert_eq!(
            cpu_model_from(amd).as_deref(),
            Some("AMD EPYC (family 25, model 17)")
        );
    }
}
