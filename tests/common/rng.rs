//! A seeded generator for randomised tests.

/// A small xorshift generator for randomised tests; the seed comes from `seed_var` when set and
/// is printed, so a failing run can be replayed.
pub struct Rng(u64);

impl Rng {
    pub fn from_env(seed_var: &str) -> Rng {
        let seed = std::env::var(seed_var)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .ok()
                    .and_then(|d| u64::try_from(d.as_nanos()).ok())
                    .unwrap_or(1)
                    | 1
            });
        eprintln!("{seed_var}={seed}");
        Rng(seed)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}
