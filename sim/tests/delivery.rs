//! `delivery-after-heal` judges requests on the main job: a world where every request is
//! excused (a fault, pressure or a slow setting in its way) would make the oracle pass
//! without looking, so the main job's first seeds must leave it a share of requests to judge.

use ctlplane_sim::engine::RunConfig;
use ctlplane_sim::scenario::run;

#[test]
fn the_main_job_leaves_requests_to_judge() {
    let (mut judged, mut requests, mut worlds) = (0u64, 0u64, 0u64);
    for seed in 0..12 {
        let r = run(&RunConfig::new(seed));
        assert!(r.violations.is_empty(), "seed {seed} failed: replay with `ctlsim run --seed {seed}`");
        let j = r.stats.get("delivery.judged").copied().unwrap_or(0);
        eprintln!("seed {seed}: {j} judged of {:?}", r.stats.get("requests"));
        judged += j;
        requests += r.stats.get("requests").copied().unwrap_or(0);
        worlds += u64::from(j > 0);
    }
    eprintln!("{judged} of {requests} requests judged, in {worlds} of 12 worlds");
    assert!(worlds >= 3, "only {worlds} of 12 worlds left a request to judge");
    assert!(judged >= 30, "only {judged} requests judged over 12 seeds");
}
