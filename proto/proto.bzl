"""C++ code generation for .proto files with Debian's protoc and gRPC plugin.

Bazel 4.2.3 offline has no proto rules we can fetch, so a genrule runs
/usr/bin/protoc directly and a cc_library compiles what it wrote.
"""

def ps_cc_proto_library(name, src, deps = [], grpc = False, visibility = None):
    """Generates and compiles C++ for one .proto file.

    Args:
      name: name of the resulting cc_library.
      src: the .proto file, in this package.
      deps: other ps_cc_proto_library targets this file imports.
      grpc: also generate gRPC service stubs.
      visibility: visibility of the cc_library; the genrule and the
        _srcs filegroup keep the package default (private).
    """
    base = src[:-len(".proto")]
    outs = [base + ".pb.h", base + ".pb.cc"]
    plugin = ""
    if grpc:
        outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
        plugin = " --grpc_out=$(GENDIR) --plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin"
    native.genrule(
        name = name + "_gen",
        srcs = [src] + [d + "_srcs" for d in deps],
        outs = outs,
        cmd = "/usr/bin/protoc -I. --cpp_out=$(GENDIR)" + plugin + " $(location " + src + ")",
    )
    native.filegroup(name = name + "_srcs", srcs = [src])
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + ["@system//:protobuf"] + (["@system//:grpc"] if grpc else []),
        visibility = visibility,
    )
