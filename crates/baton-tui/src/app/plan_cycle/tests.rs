use super::*;
use crate::panels::session_line::plan_item;

fn plan(s: &str) -> RereadSetting {
    s.parse().unwrap()
}

fn text(p: Option<RereadSetting>) -> Option<String> {
    p.map(|p| p.to_string())
}

fn budget(from: &str) -> Option<String> {
    text(next_budget(Some(&plan(from)), None))
}

fn kind(from: &str) -> String {
    next_plan_kind(Some(&plan(from))).to_string()
}

#[test]
fn the_budget_cycles_within_the_kind_and_keeps_the_selector() {
    assert_eq!(
        text(next_budget(None, None)).as_deref(),
        Some("10%:facts:word")
    );
    assert_eq!(
        budget("10%:round-trip:word").as_deref(),
        Some("20%:round-trip:word")
    );
    assert_eq!(budget("20%").as_deref(), Some("30%:facts:word"));
    assert_eq!(budget("30%").as_deref(), Some("40%:facts:word"));
    assert_eq!(budget("40%:deviation:token"), None);
    assert_eq!(budget("150ms:recency:word"), None);
    // A drop stays a drop all the way round: 0% is a drop plan of its own.
    let mut at = Some(plan("drop:0%:sentence-facts:word"));
    let drops: Vec<String> = (0..5)
        .map(|_| {
            at = next_budget(at.as_ref(), None);
            at.unwrap().to_string()
        })
        .collect();
    assert_eq!(
        drops,
        [
            "drop:10%:sentence-facts:word",
            "drop:20%:sentence-facts:word",
            "drop:30%:sentence-facts:word",
            "drop:40%:sentence-facts:word",
            "drop:0%:sentence-facts:word",
        ]
    );
    assert_eq!(
        budget("focus:150ms").as_deref(),
        Some("focus:0%:facts:word")
    );
    // Between the steps, the next one up.
    assert_eq!(
        budget("drop:25%:recency").as_deref(),
        Some("drop:30%:recency:word")
    );
    assert_eq!(budget("5%").as_deref(), Some("10%:facts:word"));
}

#[test]
fn from_off_the_budget_comes_back_with_the_selector_it_had() {
    assert_eq!(budget("40%:facts:word"), None);
    let before = plan("drop:40%:sentence-facts:sentence");
    assert_eq!(
        text(next_budget(None, Some(&before))).as_deref(),
        Some("10%:sentence-facts:sentence")
    );
    assert_eq!(
        text(next_budget(None, Some(&plan("up:40%")))).as_deref(),
        Some("10%:facts:word")
    );
}

#[test]
fn the_layers_cycle_on_their_own_and_keep_the_positions() {
    let mut at = Some(plan("up:40%:facts:word"));
    let mut seen = Vec::new();
    for _ in 0..5 {
        at = next_layers(at.as_ref(), 28);
        seen.push(text(at));
    }
    let want = [
        "40%:facts:word:upper=21",
        "40%:facts:word:upper=14",
        "40%:facts:word:upper=7",
        "40%:facts:word:lower=14",
        "40%:facts:word",
    ];
    assert_eq!(seen, want.map(|w| Some(w.to_string())));
    // From off, layers alone; after the last, off again.
    let alone = next_layers(None, 24).unwrap();
    assert_eq!(plan_item(&alone), "upper 18");
    assert_eq!(next_layers(Some(&plan("lower=12")), 24), None);
    // The budget's and the kind's steps keep the layers.
    assert_eq!(
        budget("20%:facts:word:upper=14").as_deref(),
        Some("30%:facts:word:upper=14")
    );
    assert_eq!(
        kind("20%:facts:word:upper=14"),
        "drop:20%:facts:word:upper=14"
    );
    assert!(plan_words(Some(&plan("upper=14"))).contains("residual stream"));
    assert!(plan_words(Some(&plan("20%:lower=14"))).contains("below that one"));
}

#[test]
fn the_plan_kind_cycles_through_the_products_kinds_and_keeps_the_budget() {
    assert_eq!(next_plan_kind(None).to_string(), "drop:20%:facts:word");
    assert_eq!(kind("10%:round-trip:word"), "drop:10%:round-trip:word");
    assert_eq!(kind("drop:10%"), "focus:10%:facts:word");
    assert_eq!(kind("focus:40%:recency"), "40%:recency:word");
    // A kind the product does not carry steps to the map.
    assert_eq!(kind("attend:20%"), "20%:facts:word");
    // A map plan of nothing is no plan: from 0% the map kind starts at 10%.
    assert_eq!(kind("focus:0%:recency:word"), "10%:recency:word");
    assert_eq!(kind("drop:0%"), "focus:0%:facts:word");
    // The default, for switches up only, steps to a plan for both directions.
    assert_eq!(kind("up:40%:facts:word"), "drop:40%:facts:word");
    assert_eq!(
        budget("up:20%:facts:word").as_deref(),
        Some("30%:facts:word")
    );
    // Every kind Ctrl-T offers is one the parser reads, by the name it shows.
    for k in PlanKind::PRODUCT {
        assert_eq!(plan(&format!("{}:20%", k.name())).kind, k);
    }
}
