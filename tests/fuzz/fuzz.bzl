"""ps_fuzz_target: a libFuzzer target and the replay test of its corpus."""

def ps_fuzz_target(name, deps = []):
    """Declares the fuzz target `name` (source `name`.cc, corpus corpus/`name`/).

    * `name`_replay (cc_test): the target linked with replay_main.cc, run
      over every corpus file by `bazel test //...` in the normal build.
    * `name` (cc_binary, tagged manual): the real fuzzer, linked with
      libFuzzer; built only by tests/fuzz/run.sh with --config=fuzz and
      clang in a separate output base.
    """
    corpus = "corpus/" + name.replace("_fuzzer", "")
    common_deps = [":fuzz_support"] + deps
    native.cc_test(
        name = name + "_replay",
        size = "small",
        srcs = [name + ".cc", "replay_main.cc"],
        args = ["tests/fuzz/" + corpus],
        data = native.glob([corpus + "/**"]),
        deps = common_deps,
    )
    native.cc_binary(
        name = name,
        srcs = [name + ".cc"],
        linkopts = ["-fsanitize=fuzzer"],
        tags = ["manual"],
        testonly = True,
        deps = common_deps,
    )
