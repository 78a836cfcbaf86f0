"""Repository rule exposing Debian's system libraries as cc_library targets.

Each target's compile and link flags come from pkg-config when the repository
is fetched, so the long, version-specific Abseil and gRPC link lines are never
kept by hand. A missing package fails the fetch with the apt command to run.

It also records whether the CUDA toolkit is installed, so the build can leave
the GPU path out by itself on machines without it.
"""

# target name -> (pkg-config modules, Debian package that provides them)
_LIBS = {
    "absl": ([
        "absl_status",
        "absl_statusor",
        "absl_strings",
        "absl_str_format",
        "absl_synchronization",
        "absl_time",
        "absl_flat_hash_map",
        "absl_flat_hash_set",
        "absl_span",
        "absl_hash",
        "absl_random_random",
        "absl_cleanup",
        "absl_flags",
        "absl_flags_parse",
    ], "libabsl-dev"),
    "protobuf": (["protobuf"], "libprotobuf-dev"),
    "grpc": (["grpc++"], "libgrpc++-dev"),
    "zmq": (["libzmq"], "libzmq3-dev"),
    "spdlog": (["spdlog", "fmt"], "libspdlog-dev"),
    "gtest": (["gtest", "gmock"], "libgtest-dev libgmock-dev"),
    "gtest_main": (["gtest_main", "gmock"], "libgtest-dev libgmock-dev"),
    # CPU matrix products (worker/compute). Debian's openblas.pc names the
    # pthread variant's directory, so the link does not depend on which BLAS
    # the libblas.so alternative points to.
    "openblas": (["openblas"], "libopenblas-dev"),
    # gzip-compressed data files (worker/data: Fashion-MNIST idx.gz).
    "zlib": (["zlib"], "zlib1g-dev"),
    # HTTP endpoint of every process (common/http_endpoint: /metrics, /healthz).
    "httplib": (["cpp-httplib"], "libcpp-httplib-dev"),
    # Checking the control plane's TLS files (common/grpc_security).
    "openssl": (["openssl"], "libssl-dev"),
    # The disk tier of sparse tables (server/disk_tier: cold rows on local disk).
    "rocksdb": (["rocksdb"], "librocksdb-dev"),
}

# Libraries Debian ships without a pkg-config file: target name -> (a header
# that proves the package is installed, link flags, Debian package).
_PLAIN_LIBS = {
    # Ring all-reduce of dense tables among the workers (worker/dense_ring).
    "gloo": ("/usr/include/gloo/allreduce_ring.h", ["-lgloo", "-lpthread"], "libgloo-dev"),
}

_DEPS = {
    "grpc": ["absl", "protobuf"],
    "gtest_main": ["gtest"],
}

def _pkg_config(ctx, flag, modules, package):
    result = ctx.execute(["pkg-config", flag] + modules)
    if result.return_code != 0:
        fail(("pkg-config could not find %s (%s). Install it with: " +
              "apt-get install %s pkg-config\n%s") %
             (" ".join(modules), flag, package, result.stderr))
    return [f for f in result.stdout.strip().split(" ") if f]

def _quote(items):
    return "[" + ", ".join(['"%s"' % i for i in items]) + "]"

def _system_libs_impl(ctx):
    build = ['package(default_visibility = ["//visibility:public"])', ""]
    for name, (modules, package) in _LIBS.items():
        cflags = _pkg_config(ctx, "--cflags", modules, package)
        libs = _pkg_config(ctx, "--libs", modules, package)
        defines = [f[2:] for f in cflags if f.startswith("-D")]

        build.append("cc_library(")
        build.append('    name = "%s",' % name)
        build.append("    defines = %s," % _quote(defines))
        build.append("    linkopts = %s," % _quote(libs))
        build.append("    deps = %s," % _quote([":" + d for d in _DEPS.get(name, [])]))
        build.append(")")
        build.append("")

    for name, (header, libs, package) in _PLAIN_LIBS.items():
        if not ctx.path(header).exists:
            fail("%s is missing. Install it with: apt-get install %s" % (header, package))
        build.append("cc_library(")
        build.append('    name = "%s",' % name)
        build.append("    linkopts = %s," % _quote(libs))
        build.append(")")
        build.append("")

    nvcc = ctx.path("/usr/local/cuda/bin/nvcc")
    has_cuda = nvcc.exists and ctx.os.environ.get("PS_DISABLE_CUDA", "") != "1"
    ctx.file("cuda.bzl", "HAS_CUDA = %s\n" % ("True" if has_cuda else "False"))
    ctx.file("BUILD", "\n".join(build))
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)

system_libs = repository_rule(
    implementation = _system_libs_impl,
    environ = ["PS_DISABLE_CUDA", "PKG_CONFIG_PATH"],
    local = True,
)
