import clattn
model = clattn.load_model("../shared/data/kwt1")                       # KWT-1 keyword spotter
x = clattn.read_safetensors("../shared/data/kwt1/features_fsdd_test.safetensors")["features"]
full = model.forward_features(x).argmax(1)                             # 300 clips, full attention
model.set_attention("improved-clustered:clusters=25")                  # every layer
print("agreement", (model.forward_features(x).argmax(1) == full).mean())   # 0.977
