"""fuzz_replay_test: a fuzz target built with replay_main.cc, run over its seeds."""

def fuzz_replay_test(name, deps):
    """`<name>_fuzzer.cc` linked with the replay main; the test replays corpus/<name>/.

    Args:
      name: the target's name, as tools/fuzz.sh knows it.
      deps: what the target's sources need.
    """
    native.cc_test(
        name = name + "_fuzzer_replay",
        size = "small",
        srcs = [name + "_fuzzer.cc"],
        args = ["fuzz/corpus/" + name],
        data = native.glob(["corpus/" + name + "/**"]),
        deps = deps + [
            ":fuzz_input",
            ":replay_main",
        ],
    )
