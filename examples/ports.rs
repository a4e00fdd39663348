//! Throughput of single AVX instructions and pairs of them (independent copies in a
//! loop), in cycles calibrated by a chain of dependent `vaddpd` (3 cycles each on Zen
//! 3): shows which conversions and shuffles share an execution port. `[{m}]` in a
//! probe is a 64-byte buffer of zeros, for the memory-operand forms.
//! `cargo run --release --example ports`.
#[cfg(target_arch = "x86_64")]
mod probes {
    use std::arch::asm;
    use std::time::Instant;
    static ZEROS: [f64; 8] = [0.0; 8];
    macro_rules! probe {
        ($name:expr, $body:expr) => {{
            let iters = 20_000_000u64;
            let mut best = f64::MAX;
            for _ in 0..5 {
                let t0 = Instant::now();
                unsafe { asm!(
                    "/* {m} */",
                    "vxorpd ymm0, ymm0, ymm0", "vxorpd ymm1, ymm1, ymm1","vxorpd ymm2, ymm2, ymm2","vxorpd ymm3, ymm3, ymm3",
                    "vxorpd ymm4, ymm4, ymm4","vxorpd ymm5, ymm5, ymm5","vxorpd ymm6, ymm6, ymm6","vxorpd ymm7, ymm7, ymm7",
                    "2:",
                    $body,
                    "dec {n}", "jnz 2b",
                    n = inout(reg) iters => _,
                    m = in(reg) ZEROS.as_ptr(),
                    out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _, out("ymm4") _, out("ymm5") _, out("ymm6") _, out("ymm7") _,
                    out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _, out("ymm12") _, out("ymm13") _, out("ymm14") _, out("ymm15") _,
                ); }
                best = best.min(t0.elapsed().as_secs_f64() / iters as f64);
            }
            best
        }};
    }
    pub fn main() {
        // calibration: 4 dependent vaddpd = 12 cycles on Zen 3
        let cal = probe!(
            "cal",
            "vaddpd ymm0, ymm0, ymm1\nvaddpd ymm0, ymm0, ymm1\nvaddpd ymm0, ymm0, ymm1\nvaddpd ymm0, ymm0, ymm1"
        );
        let cyc = cal / 12.0;
        println!("cycle = {:.3} ns ({:.2} GHz)", cyc * 1e9, 1e-9 / cyc);
        let tests: Vec<(&str, f64)> = vec![
            ("4x vcvtps2pd ymm,xmm", probe!("", "vcvtps2pd ymm8, xmm0\nvcvtps2pd ymm9, xmm1\nvcvtps2pd ymm10, xmm2\nvcvtps2pd ymm11, xmm3")),
            ("4x vcvtps2pd xmm,xmm", probe!("", "vcvtps2pd xmm8, xmm0\nvcvtps2pd xmm9, xmm1\nvcvtps2pd xmm10, xmm2\nvcvtps2pd xmm11, xmm3")),
            ("4x vcvtpd2ps xmm,ymm", probe!("", "vcvtpd2ps xmm8, ymm0\nvcvtpd2ps xmm9, ymm1\nvcvtpd2ps xmm10, ymm2\nvcvtpd2ps xmm11, ymm3")),
            ("4x vcvtpd2ps xmm,xmm", probe!("", "vcvtpd2ps xmm8, xmm0\nvcvtpd2ps xmm9, xmm1\nvcvtpd2ps xmm10, xmm2\nvcvtpd2ps xmm11, xmm3")),
            ("4x vperm2f128", probe!("", "vperm2f128 ymm8, ymm0, ymm1, 0x21\nvperm2f128 ymm9, ymm1, ymm2, 0x21\nvperm2f128 ymm10, ymm2, ymm3, 0x21\nvperm2f128 ymm11, ymm3, ymm4, 0x21")),
            ("4x vbroadcastsd ymm,xmm", probe!("", "vbroadcastsd ymm8, xmm0\nvbroadcastsd ymm9, xmm1\nvbroadcastsd ymm10, xmm2\nvbroadcastsd ymm11, xmm3")),
            ("4x vpmovzxdq ymm,xmm", probe!("", "vpmovzxdq ymm8, xmm0\nvpmovzxdq ymm9, xmm1\nvpmovzxdq ymm10, xmm2\nvpmovzxdq ymm11, xmm3")),
            ("4x vinsertf128", probe!("", "vinsertf128 ymm8, ymm0, xmm1, 1\nvinsertf128 ymm9, ymm1, xmm2, 1\nvinsertf128 ymm10, ymm2, xmm3, 1\nvinsertf128 ymm11, ymm3, xmm4, 1")),
            ("4x vpsllq ymm", probe!("", "vpsllq ymm8, ymm0, 29\nvpsllq ymm9, ymm1, 29\nvpsllq ymm10, ymm2, 29\nvpsllq ymm11, ymm3, 29")),
            ("4x vpand ymm", probe!("", "vpand ymm8, ymm0, ymm1\nvpand ymm9, ymm1, ymm2\nvpand ymm10, ymm2, ymm3\nvpand ymm11, ymm3, ymm4")),
            ("4x vunpcklps ymm", probe!("", "vunpcklps ymm8, ymm0, ymm1\nvunpcklps ymm9, ymm1, ymm2\nvunpcklps ymm10, ymm2, ymm3\nvunpcklps ymm11, ymm3, ymm4")),
            ("4x vmulpd ymm", probe!("", "vmulpd ymm8, ymm0, ymm1\nvmulpd ymm9, ymm1, ymm2\nvmulpd ymm10, ymm2, ymm3\nvmulpd ymm11, ymm3, ymm4")),
            ("4x vshufps ymm", probe!("", "vshufps ymm8, ymm0, ymm1, 0x88\nvshufps ymm9, ymm1, ymm2, 0x88\nvshufps ymm10, ymm2, ymm3, 0x88\nvshufps ymm11, ymm3, ymm4, 0x88")),
            ("4x vpermps ymm", probe!("", "vpermps ymm8, ymm0, ymm1\nvpermps ymm9, ymm1, ymm2\nvpermps ymm10, ymm2, ymm3\nvpermps ymm11, ymm3, ymm4")),
            ("2 cvtps2pd y + 2 vperm2f128", probe!("", "vcvtps2pd ymm8, xmm0\nvcvtps2pd ymm9, xmm1\nvperm2f128 ymm10, ymm2, ymm3, 0x21\nvperm2f128 ymm11, ymm3, ymm4, 0x21")),
            ("2 cvtps2pd x + 2 vperm2f128", probe!("", "vcvtps2pd xmm8, xmm0\nvcvtps2pd xmm9, xmm1\nvperm2f128 ymm10, ymm2, ymm3, 0x21\nvperm2f128 ymm11, ymm3, ymm4, 0x21")),
            ("2 cvtpd2ps x,x + 2 vperm2f128", probe!("", "vcvtpd2ps xmm8, xmm0\nvcvtpd2ps xmm9, xmm1\nvperm2f128 ymm10, ymm2, ymm3, 0x21\nvperm2f128 ymm11, ymm3, ymm4, 0x21")),
            ("2 vpsllq + 2 vperm2f128", probe!("", "vpsllq ymm8, ymm0, 29\nvpsllq ymm9, ymm1, 29\nvperm2f128 ymm10, ymm2, ymm3, 0x21\nvperm2f128 ymm11, ymm3, ymm4, 0x21")),
            ("2 vunpcklps + 2 vperm2f128", probe!("", "vunpcklps ymm8, ymm0, ymm1\nvunpcklps ymm9, ymm1, ymm2\nvperm2f128 ymm10, ymm2, ymm3, 0x21\nvperm2f128 ymm11, ymm3, ymm4, 0x21")),
            ("2 vcvtps2pd x + 2 vmulpd", probe!("", "vcvtps2pd xmm8, xmm0\nvcvtps2pd xmm9, xmm1\nvmulpd ymm10, ymm2, ymm3\nvmulpd ymm11, ymm3, ymm4")),
            ("2 vcvtps2pd y + 2 vmulpd", probe!("", "vcvtps2pd ymm8, xmm0\nvcvtps2pd ymm9, xmm1\nvmulpd ymm10, ymm2, ymm3\nvmulpd ymm11, ymm3, ymm4")),
            ("2 vcvtps2pd y + 2 vaddpd", probe!("", "vcvtps2pd ymm8, xmm0\nvcvtps2pd ymm9, xmm1\nvaddpd ymm10, ymm2, ymm3\nvaddpd ymm11, ymm3, ymm4")),
            ("2 vperm2f128 + 2 vaddpd", probe!("", "vperm2f128 ymm8, ymm0, ymm1, 0x21\nvperm2f128 ymm9, ymm1, ymm2, 0x21\nvaddpd ymm10, ymm2, ymm3\nvaddpd ymm11, ymm3, ymm4")),
            ("2 vperm2f128 + 2 vmulpd", probe!("", "vperm2f128 ymm8, ymm0, ymm1, 0x21\nvperm2f128 ymm9, ymm1, ymm2, 0x21\nvmulpd ymm10, ymm2, ymm3\nvmulpd ymm11, ymm3, ymm4")),
            // From memory the widening is one micro-op on the add pipes (two per cycle);
            // from a register it is two and shares the vperm2f128 pipe.
            ("4x vcvtps2pd ymm,m128", probe!("", "vcvtps2pd ymm8, [{m}]\nvcvtps2pd ymm9, [{m}]\nvcvtps2pd ymm10, [{m}]\nvcvtps2pd ymm11, [{m}]")),
            ("2 cvtps2pd y,m + 2 vperm2f128", probe!("", "vcvtps2pd ymm8, [{m}]\nvcvtps2pd ymm9, [{m}]\nvperm2f128 ymm10, ymm2, ymm3, 0x21\nvperm2f128 ymm11, ymm3, ymm4, 0x21")),
            ("2 cvtps2pd y,m + 2 vaddpd", probe!("", "vcvtps2pd ymm8, [{m}]\nvcvtps2pd ymm9, [{m}]\nvaddpd ymm10, ymm2, ymm3\nvaddpd ymm11, ymm3, ymm4")),
            ("2 cvtps2pd y,m + 2 vmulpd", probe!("", "vcvtps2pd ymm8, [{m}]\nvcvtps2pd ymm9, [{m}]\nvmulpd ymm10, ymm2, ymm3\nvmulpd ymm11, ymm3, ymm4")),
            ("2 cvtpd2ps x,y + 2 vperm2f128", probe!("", "vcvtpd2ps xmm8, ymm0\nvcvtpd2ps xmm9, ymm1\nvperm2f128 ymm10, ymm2, ymm3, 0x21\nvperm2f128 ymm11, ymm3, ymm4, 0x21")),
            ("2 vbroadcastsd y,x + 2 vperm2f128", probe!("", "vbroadcastsd ymm8, xmm0\nvbroadcastsd ymm9, xmm1\nvperm2f128 ymm10, ymm2, ymm3, 0x21\nvperm2f128 ymm11, ymm3, ymm4, 0x21")),
            // Which pipe is the busy one: it is also an FMA/multiply pipe (two vperm2f128
            // and four vmulpd take 3 cycles, with four vaddpd 2), and it runs vextractf128
            // too; in-lane shuffles (vunpckhpd, vmovddup) go to it or to an add pipe.
            ("2 vperm2f128 + 4 vmulpd", probe!("", "vperm2f128 ymm8, ymm2, ymm3, 0x21\nvperm2f128 ymm9, ymm3, ymm4, 0x21\nvmulpd ymm10, ymm2, ymm3\nvmulpd ymm11, ymm3, ymm4\nvmulpd ymm12, ymm2, ymm3\nvmulpd ymm13, ymm3, ymm4")),
            ("2 vperm2f128 + 4 vaddpd", probe!("", "vperm2f128 ymm8, ymm2, ymm3, 0x21\nvperm2f128 ymm9, ymm3, ymm4, 0x21\nvaddpd ymm10, ymm2, ymm3\nvaddpd ymm11, ymm3, ymm4\nvaddpd ymm12, ymm2, ymm3\nvaddpd ymm13, ymm3, ymm4")),
            ("4 vunpckhpd + 4 vmulpd", probe!("", "vunpckhpd ymm6, ymm2, ymm3\nvunpckhpd ymm7, ymm3, ymm4\nvunpckhpd ymm8, ymm2, ymm3\nvunpckhpd ymm9, ymm3, ymm4\nvmulpd ymm10, ymm2, ymm3\nvmulpd ymm11, ymm3, ymm4\nvmulpd ymm12, ymm2, ymm3\nvmulpd ymm13, ymm3, ymm4")),
            ("4 vunpckhpd + 4 vaddpd", probe!("", "vunpckhpd ymm6, ymm2, ymm3\nvunpckhpd ymm7, ymm3, ymm4\nvunpckhpd ymm8, ymm2, ymm3\nvunpckhpd ymm9, ymm3, ymm4\nvaddpd ymm10, ymm2, ymm3\nvaddpd ymm11, ymm3, ymm4\nvaddpd ymm12, ymm2, ymm3\nvaddpd ymm13, ymm3, ymm4")),
            ("2 vextractf128 + 2 vperm2f128", probe!("", "vextractf128 xmm6, ymm0, 1\nvextractf128 xmm7, ymm1, 1\nvperm2f128 ymm8, ymm2, ymm3, 0x21\nvperm2f128 ymm9, ymm3, ymm4, 0x21")),
            ("2 cvtpd2ps x,y + 4 vmulpd", probe!("", "vcvtpd2ps xmm8, ymm2\nvcvtpd2ps xmm9, ymm3\nvmulpd ymm10, ymm2, ymm3\nvmulpd ymm11, ymm3, ymm4\nvmulpd ymm12, ymm2, ymm3\nvmulpd ymm13, ymm3, ymm4")),
            ("2 cvtpd2ps x,y + 4 vaddpd", probe!("", "vcvtpd2ps xmm8, ymm2\nvcvtpd2ps xmm9, ymm3\nvaddpd ymm10, ymm2, ymm3\nvaddpd ymm11, ymm3, ymm4\nvaddpd ymm12, ymm2, ymm3\nvaddpd ymm13, ymm3, ymm4")),
        ];
        for (n, t) in tests {
            println!("{n:32} {:.2} cycles/iter", t / cyc);
        }
    }
}

fn main() {
    #[cfg(target_arch = "x86_64")]
    probes::main();
    #[cfg(not(target_arch = "x86_64"))]
    println!("x86_64 only");
}
