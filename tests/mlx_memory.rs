//! MLX's allocator counters are process-wide, so this check runs alone in its own binary.

use zimage::mlx::{self, memory, ops, random, Dtype};

#[test]
fn dropping_arrays_returns_memory_to_baseline() {
    mlx::memory::clear_cache();
    let base = memory::active_memory();
    {
        let k = random::key(1).unwrap();
        let a = random::normal(&[512, 512], Dtype::F32, &k).unwrap();
        let b = ops::matmul(&a, &a).unwrap();
        b.eval().unwrap();
        assert!(
            memory::active_memory() >= base + 512 * 512 * 4,
            "{} vs {base}",
            memory::active_memory()
        );
        assert!(memory::peak_memory() >= memory::active_memory());
    }
    assert_eq!(memory::active_memory(), base);
    memory::clear_cache();
    assert_eq!(memory::cache_memory(), 0);
}
