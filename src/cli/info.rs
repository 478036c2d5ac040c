//! `zimage info`: what MLX this binary runs on and how fast its f32 matmul is.
use std::process::ExitCode;
use std::time::Instant;
use zimage::mlx::{self, ops, random, Device, Dtype};

#[derive(clap::Args, Debug)]
pub struct InfoArgs {
    /// Matrix size of the quick matmul throughput figure (0 skips it; at most 8192, whose
    /// three f32 matrices take 768 MiB).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(i32).range(0..=8192))]
    pub matmul_size: i32,
}

pub fn run(a: InfoArgs) -> anyhow::Result<ExitCode> {
    let build = mlx::build_info();
    println!("MLX version   {}", mlx::version());
    println!("variant       {}", build.variant);
    println!("library       {}", build.lib_dir);
    println!("found via     {}", build.source);
    if let Some(path) = mlx::runtime::library_path() {
        println!("opened        {} (at start)", path.display());
    }
    if let Some(dir) = mlx::runtime::kernel_cache_dir() {
        println!("kernel cache  {}", dir.display());
    }
    let gpu = if mlx::gpu_available() {
        "gpu available"
    } else {
        "no gpu"
    };
    println!(
        "devices       cpu, {gpu} (default: {:?})",
        zimage::platform::default_device()
    );
    let graph = zimage::platform::graph_from_env().map_err(anyhow::Error::msg)?;
    println!(
        "graph         {:?}{}",
        zimage::platform::graph(),
        if graph.is_some() {
            " (ZIMAGE_GRAPH)"
        } else {
            ""
        }
    );
    println!("BLAS          {}", mlx::blas_description());
    if a.matmul_size > 0 {
        let gflops = matmul_gflops(a.matmul_size)?;
        println!(
            "f32 matmul    {gflops:.1} GFLOP/s at {n}×{n}×{n} on {:?}",
            mlx::default_device(),
            n = a.matmul_size
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Best of a few timed f32 products after a warm-up.
fn matmul_gflops(n: i32) -> anyhow::Result<f64> {
    zimage::platform::use_default_device()?;
    let key = random::key(0)?;
    let x = random::normal(&[n, n], Dtype::F32, &key)?;
    let y = random::normal(&[n, n], Dtype::F32, &random::key(1)?)?;
    mlx::eval(&[&x, &y])?;
    ops::matmul(&x, &y)?.eval()?;
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        ops::matmul(&x, &y)?.eval()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    let _ = Device::Cpu;
    Ok(2.0 * (n as f64).powi(3) / best / 1e9)
}
