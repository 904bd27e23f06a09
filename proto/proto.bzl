"""Generates C++ from a .proto with the system protoc (and gRPC plugin)."""

def baton_proto_library(name, src, grpc = False, deps = []):
    base = src[:-len(".proto")]
    outs = [base + ".pb.h", base + ".pb.cc"]
    cmd = "/usr/bin/protoc -I$$(dirname $(location {src})) --cpp_out=$(@D) ".format(src = src)
    if grpc:
        outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
        cmd += "--grpc_out=$(@D) --plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin "
    cmd += "$(location {src})".format(src = src)
    native.genrule(
        name = name + "_gen",
        srcs = [src],
        outs = outs,
        cmd = cmd,
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + ["@system//:protobuf"] + (["@system//:grpc"] if grpc else []),
        copts = ["-Wno-unused-parameter"],
    )
