//! The benchmarks' Python peers and loaders (bench/scripts/*.py): run one, and read the
//! `name=value` fields it prints.

use std::process::Command;
use std::str::FromStr;

/// What a script printed on its standard output.
pub(crate) struct Printed {
    what: String,
    text: String,
}

impl Printed {
    /// The value of field `name` (printed as `name=value`).
    pub(crate) fn field<T: FromStr>(&self, name: &str) -> Result<T, String> {
        self.text
            .split_whitespace()
            .find_map(|word| word.strip_prefix(name)?.strip_prefix('='))
            .and_then(|value| value.parse().ok())
            .ok_or_else(|| format!("{} printed no {name}: {}", self.what, self.text))
    }
}

/// Run `bench/scripts/{script}` with `python` and `arguments`; `what` names it in errors, and
/// `hint` says what to install when it fails.
pub(crate) fn run(
    python: &str,
    script: &str,
    arguments: &[String],
    what: &str,
    hint: &str,
) -> Result<Printed, String> {
    let path = format!("{}/scripts/{script}", env!("CARGO_MANIFEST_DIR"));
    let output = Command::new(python)
        .arg(&path)
        .args(arguments)
        .output()
        .map_err(|error| format!("cannot run {python} ({hint}): {error}"))?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        return Err(format!(
            "{what} failed ({hint}): {text}{}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(Printed {
        what: what.to_string(),
        text,
    })
}
